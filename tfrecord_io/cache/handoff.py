"""The graph side of the shard cache: what ``tf.data`` sees (protocol in ``tfrecord_io.cache``).

Only TensorFlow graph ops: request markers written with ``tf.io.write_file``, waits that poll
with ``tf.io.matching_files`` over a sleeping ``range``, and ``TFRecordDataset`` over the local
copy, so iterators built on it stay checkpointable. ``GraphHandoff`` is the part of
``ShardCache`` that builds them; the Python side (``tfrecord_io.cache.state``) answers the
markers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tfrecord_io.cache.config import CacheConfig
from tfrecord_io.cache.names import BASENAME_BYTES, HASH_BUCKETS, HASH_KEY, local_names

if TYPE_CHECKING:  # TensorFlow is imported lazily: importing it costs seconds.
    import tensorflow as tf

__all__ = ["GraphHandoff", "local_name_graph"]


def _after(op: Any, value: tf.Tensor) -> tf.Tensor:
    """``value``, computed after ``op`` has run."""
    import tensorflow as tf

    with tf.control_dependencies([op]):
        return tf.identity(value)


def _present(path: tf.Tensor) -> tf.Tensor:
    import tensorflow as tf

    return tf.greater(tf.size(tf.io.matching_files(path)), 0)


def local_name_graph(uri: tf.Tensor) -> tf.Tensor:
    """The cache file name of a shard URI, in graph ops: ``tfrecord_io.cache.names.local_name``
    computes the same name in pure Python (and its module says how)."""
    import tensorflow as tf

    digest = tf.strings.to_hash_bucket_strong(uri, HASH_BUCKETS, key=list(HASH_KEY))
    base = tf.strings.regex_replace(uri, r"^.*/", "")
    base = tf.strings.regex_replace(base, r"[^A-Za-z0-9._-]", "_")
    base = tf.strings.substr(base, 0, BASENAME_BYTES)
    return tf.strings.join([tf.strings.as_string(digest), "-", base])


def _sleeping_range(start: int, stop: int, sleep_us: int) -> tf.data.Dataset:
    """``range(start, stop)`` that sleeps before each element (``SleepDataset`` via the public
    variant API; ``tf.data.experimental.sleep`` is not exported in TF 2.21)."""
    import tensorflow as tf

    ds = tf.data.Dataset.range(start, stop)
    variant = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(ds),
        sleep_microseconds=sleep_us,
        output_types=[tf.int64],
        output_shapes=[tf.TensorShape([])],
    )
    return tf.data.experimental.from_variant(variant, ds.element_spec)


class GraphHandoff:
    """The ``tf.data`` side of ``ShardCache``: announcing shards ahead, waiting for them, and
    reading the local copy, all in graph ops.

    Attributes (set by ``ShardCache``):
      config: the cache configuration.
      _dirs: the cache's subdirectories by role (``shards``, ``requests``, ``acks``,
        ``errors``…).
    """

    config: CacheConfig
    _dirs: dict[str, str]

    @staticmethod
    def local_names(uris: Sequence[str]) -> list[str]:
        """Cache file names of ``uris`` (stable across processes), computed without TensorFlow
        (``tfrecord_io.cache.names``): the same names ``local_name_graph`` gives."""
        return local_names(uris)

    def read_ahead(self, files: tf.data.Dataset, path_index: int | None = None) -> tf.data.Dataset:
        """Announces each file ``download_ahead`` elements before the consumer reaches it.

        Args:
          files: a dataset of shard URIs, or of tuples with the URI at ``path_index``.
          path_index: where the URI is in each element (None: the element is the URI).

        Returns:
          The same elements, in the same order.
        """
        import tensorflow as tf

        requests_dir = self._dirs["requests"]

        def announce(*element: tf.Tensor) -> Any:
            uri = element[0] if path_index is None else element[path_index]
            marker = tf.strings.join([requests_dir, "/", local_name_graph(uri), ".ahead.0"])
            written = tf.io.write_file(marker, "")
            with tf.control_dependencies([written]):
                out = [tf.identity(t) for t in element]
            return out[0] if path_index is None else tuple(out)

        options = tf.data.Options()
        # The marker writes are stateful but hold no state: nothing needs saving.
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        files = files.with_options(options).map(announce)
        if self.config.download_ahead:
            files = files.prefetch(self.config.download_ahead)
        return files

    def _paths(self, uri: tf.Tensor, rid: tf.Tensor) -> dict[str, tf.Tensor]:
        import tensorflow as tf

        name = local_name_graph(uri)
        requests = self._dirs["requests"]
        return {
            "local": tf.strings.join([self._dirs["shards"], "/", name]),
            "error": tf.strings.join([self._dirs["errors"], "/", name]),
            "want": tf.strings.join([requests, "/", name, ".want.", rid]),
            "need": tf.strings.join([requests, "/", name, ".need.", rid]),
            "done": tf.strings.join([requests, "/", name, ".done.", rid]),
            "ack": tf.strings.join([self._dirs["acks"], "/", name, ".", rid]),
        }

    def _failure(self, uri: tf.Tensor, error: tf.Tensor, what: str) -> tf.Tensor:
        """The error marker's text if there is one, else a timeout message naming ``uri``."""
        import tensorflow as tf

        return tf.cond(
            _present(error),
            lambda: tf.io.read_file(error),
            lambda: tf.strings.join(
                [
                    uri,
                    f": not {what} within {self.config.wait_timeout_s:g}s (is the shard cache "
                    f"of this process still running?)",
                ]
            ),
        )

    @property
    def _max_polls(self) -> int:
        return max(1, int(self.config.wait_timeout_s / self.config.poll_interval_s))

    @property
    def _total_ticks(self) -> int:
        return 1 + 10 + self._max_polls

    def _polls(self) -> tf.data.Dataset:
        """Poll ticks 0, 1, 2…: tick 0 at once (often the answer is already there), ten at
        0.2 ms (the scanner, woken by inotify, answers within about a millisecond), then one
        every ``poll_interval_s``."""
        import tensorflow as tf

        poll_us = max(1, int(self.config.poll_interval_s * 1e6))
        return (
            tf.data.Dataset.range(1)
            .concatenate(_sleeping_range(1, 11, min(200, poll_us)))
            .concatenate(_sleeping_range(11, self._total_ticks, poll_us))
        )

    def _until_present(self, uri: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Graph ops: unless ``uri`` is on disk already, ask for it and wait until it is (or
        failed). The cache pins it from the download until this wait has seen it (a few
        milliseconds), so it is not evicted unseen; the request is repeated every second in
        case it lapsed. Returns (local path, failed?, failure message).
        """
        import tensorflow as tf

        paths = self._paths(uri, self._request_id())
        reask_every = max(1, int(1.0 / self.config.poll_interval_s))

        def keep_waiting(i: tf.Tensor) -> tf.Tensor:
            waiting = tf.logical_not(
                tf.logical_or(_present(paths["local"]), _present(paths["error"]))
            )

            def reask() -> tf.Tensor:
                with tf.control_dependencies([tf.io.write_file(paths["want"], "")]):
                    return tf.constant(True)

            asked = tf.cond(
                tf.logical_and(waiting, tf.equal(i % reask_every, reask_every - 1)),
                reask,
                lambda: tf.constant(True),
            )
            with tf.control_dependencies([asked]):
                return tf.identity(waiting)

        def poll() -> tf.Tensor:
            with tf.control_dependencies([tf.io.write_file(paths["want"], "")]):
                ticks = (
                    self._polls()
                    .take_while(keep_waiting)
                    .reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
                )
            with tf.control_dependencies([ticks]):
                return _after(tf.io.write_file(paths["done"], ""), ticks)

        # Usually the shard is already there (downloaded ahead): skip the polling loop, whose
        # reduce costs milliseconds to set up. A restore into an empty cache takes the loop.
        polls = tf.cond(_present(paths["local"]), lambda: tf.constant(0, tf.int64), poll)
        with tf.control_dependencies([polls]):
            # Seeing the file once is enough: the pin before the read asks again if it went.
            exhausted = tf.greater_equal(polls, self._total_ticks)
            failed = tf.logical_or(_present(paths["error"]), exhausted)
            message = self._failure(uri, paths["error"], "downloaded")
        return paths["local"], failed, message

    @staticmethod
    def _request_id() -> tf.Tensor:
        import tensorflow as tf

        # Unique per reader so that the markers and acks of two readers never merge.
        return tf.strings.as_string(
            tf.random.uniform([], maxval=(1 << 62), dtype=tf.int64), width=19, fill="0"
        )

    def _pinned_records(
        self,
        uri: tf.Tensor,
        buffer_size: int | None,
        skip_failed: bool,
        skip: tf.Tensor | None = None,
    ) -> tf.data.Dataset:
        """The records of a present shard, pinned from just before the open to the last record.

        The wait is dataset iteration over poll ticks (a ``filter`` that writes the request on
        the first tick, then a ``take(1)``), so it blocks the reader's own tf.data thread, not a
        shared op thread; few functions are used because each costs time on every shard.
        """
        import tensorflow as tf

        paths = self._paths(uri, self._request_id())

        def answered(tick: tf.Tensor) -> tf.Tensor:
            asked = tf.cond(
                tf.equal(tick, 0),
                lambda: _after(tf.io.write_file(paths["need"], ""), tf.constant(True)),
                lambda: tf.constant(True),
            )
            with tf.control_dependencies([asked]):
                return tf.logical_or(_present(paths["ack"]), _present(paths["error"]))

        def usable() -> tf.Tensor:
            # After a lapsed pin the file may still be there: readable is what matters.
            return tf.logical_and(
                tf.logical_not(_present(paths["error"])), _present(paths["local"])
            )

        names = self._polls().filter(answered).take(1)
        if skip_failed:
            names = names.filter(lambda _: usable()).map(lambda _: paths["local"])
        else:

            def checked(_: tf.Tensor) -> tf.Tensor:
                message = self._failure(uri, paths["error"], "pinned")
                check = tf.debugging.Assert(usable(), ["shard cache:", message], summarize=1)
                return _after(check, paths["local"])

            names = names.map(checked)

        def release(_: tf.Tensor) -> tf.Tensor:
            return _after(tf.io.write_file(paths["done"], ""), tf.constant(False))

        finished = tf.data.Dataset.from_tensors(tf.constant(b"")).filter(release)
        records = tf.data.TFRecordDataset(names, buffer_size=buffer_size)
        if skip is not None:
            records = records.skip(skip)
        return records.concatenate(finished)

    def records(
        self,
        uri: tf.Tensor,
        buffer_size: int | None = None,
        *,
        skip_failed: bool = False,
        skip: tf.Tensor | None = None,
    ) -> tf.data.Dataset:
        """Graph: the records of shard ``uri``, read from the cache (for interleave functions).

        Drop-in for ``tf.data.TFRecordDataset(uri, buffer_size=...)``. Two waits:

        * when the interleave builds the element (and again when a checkpoint is restored,
          which is what makes a restore re-download into an empty cache): until the shard is
          on disk, without pinning it, so elements built ahead hold no space;
        * on the element's first read: until the shard is pinned for this reader, right before
          ``TFRecordDataset`` opens it in the same step; the pin ends after the last record.

        Args:
          uri: scalar string tensor, a registered shard URI.
          buffer_size: the read buffer of ``TFRecordDataset``.
          skip_failed: a shard that could not be downloaded or verified reads as empty (the cache
            logs why) instead of failing; for callers that detect and count short shards.
          skip: records to skip inside the file reader before the first one yielded.

        Raises (when run):
          tf.errors.InvalidArgumentError: with the cache's message naming the URI, if the
            shard could not be downloaded or verified (unless ``skip_failed``).
        """
        import tensorflow as tf

        _, failed, message = self._until_present(uri)
        if skip_failed:
            # A failed shard reads as empty: the first read finds the error marker.
            with tf.control_dependencies([failed]):
                return self._pinned_records(uri, buffer_size, skip_failed=True, skip=skip)
        check = tf.debugging.Assert(tf.logical_not(failed), ["shard cache:", message], summarize=1)
        with tf.control_dependencies([check]):
            return self._pinned_records(uri, buffer_size, skip_failed=False, skip=skip)
