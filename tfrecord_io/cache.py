"""A bounded local cache that streams shard files from object stores into ``tf.data``.

TensorFlow 2.21 cannot open ``s3://`` and its ``gs://`` ignores ``STORAGE_EMULATOR_HOST``, so
shards are downloaded to local disk and ``tf.data`` reads the local copies. The cache:

* downloads ahead in read order, a bounded number of shards ahead, on background threads;
* checks every download's size and SHA-256 against ``dataset.json``; a mismatch fails with an
  error naming the shard, and the bad bytes are removed;
* keeps the files it holds within ``cache_bytes``, evicting shards that were already read, least
  recently used first;
* refuses to start when ``cache_bytes`` is smaller than the largest shard.

**How tf.data waits for a shard without ``py_function``.** ``py_function`` cannot be
checkpointed, and a generator of local paths cannot either. Instead the two sides talk through
small marker files, using only TensorFlow graph ops:

1. ``read_ahead`` maps the (shuffled) file stream with ``tf.io.write_file`` of a request marker
   ``requests/<name>.ahead.0`` and prefetches ``download_ahead`` elements: markers are written in
   read order, ahead of the interleave that reads them.
2. ``records`` (used inside the interleave function in place of ``TFRecordDataset``) has two
   waits. When the interleave builds the element (and when a checkpoint is restored), if the
   shard is not on disk yet, it writes ``requests/<name>.want.<id>`` (a random request id)
   and polls (``tf.io.matching_files`` in a ``take_while`` over a sleeping ``range``) until
   ``shards/<name>`` or ``errors/<name>`` exists, then writes ``requests/<name>.done.<id>``.
   On the element's first read, in tf.data's own thread, it writes ``.need.<id>`` (another
   id) and polls until ``acks/<name>.<id>`` or the error exists; ``TFRecordDataset`` opens the
   file in that same step, and after the last record that id's ``.done`` is written. An error
   marker fails the step with its text, which names the URI.
3. A scanner thread here, woken by inotify, turns markers into download jobs (wanted shards
   first) and *pins* a shard for each want or need until its done: a pinned shard is not
   evicted. A need is acked only once the verified file is in place and pinned. Pins also end
   when the process is seen holding the file open (evicting an open file is harmless on POSIX:
   the reader keeps its descriptor) or after ``pin_s`` (an abandoned iterator). A want's pin
   lasts only until its waiter has seen the file, so elements that ``interleave`` builds
   ahead hold no space: a cache of one shard still makes progress.

**What resumes exactly.** The iterator state that ``tf.train.Checkpoint(iterator=it)`` saves is
plain tf.data state: file order, prefetch buffer, interleave positions and record offsets.
Restoring re-runs the interleave function for the shards in flight, whose first wait
re-downloads them, so a fresh process with an empty cache continues exactly. The
restored record readers reopen the *same local path*, so a restore must use the same
``cache_dir`` (the default is derived from the source URI). The marker ops are
stateful, so the file stream carries ``ExternalStatePolicy.IGNORE``: they hold no state that
would need saving.

One process owns a cache directory at a time (an ``flock`` on ``cache_dir/.lock``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import heapq
import itertools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from objstore import (
    ObjectStoreError,
    RetryPolicy,
    get_store,
    is_object_store_uri,
    redact,
)

if TYPE_CHECKING:  # TensorFlow is imported lazily: importing it costs seconds.
    import tensorflow as tf

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "CacheConfig",
    "CacheDirInUseError",
    "CacheStats",
    "RemoteShard",
    "ShardCache",
    "ShardIntegrityError",
    "default_cache_bytes",
    "default_cache_dir",
    "open_cache",
    "open_default_cache",
]

_log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 10 << 30
_GLOB_CHARS = frozenset("*?[]\\")
_HASH_KEY = (0x7466726563, 0x6F72645F696F)  # fixed: local names must be stable across processes
_HASH_BUCKETS = (1 << 62) - 1


class CacheDirInUseError(RuntimeError):
    """Another process holds the cache directory."""


class ShardIntegrityError(ValueError):
    """A downloaded shard does not match ``dataset.json`` (SHA-256 or size).

    Attributes:
      uri: the shard's URI.
    """

    def __init__(self, message: str, *, uri: str) -> None:
        super().__init__(redact(message))
        self.uri = uri


@dataclasses.dataclass(frozen=True)
class RemoteShard:
    """A shard to cache: its URI, committed size and SHA-256 (None for foreign shards)."""

    uri: str
    num_bytes: int
    sha256: str | None = None

    def __post_init__(self) -> None:
        if not is_object_store_uri(self.uri):
            raise ValueError(f"expected an s3:// or gs:// shard URI, got {redact(self.uri)!r}")
        if not isinstance(self.num_bytes, int) or self.num_bytes < 0:
            raise ValueError(f"num_bytes of {self.uri} must be an int >= 0, got {self.num_bytes!r}")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """How the shard cache behaves.

    Attributes:
      cache_dir: local directory owned by the cache (created if needed). No glob characters.
      cache_bytes: the most bytes of shard files kept in ``cache_dir``.
      download_ahead: shards announced ahead of the interleave, in read order.
      download_threads: concurrent downloads.
      chunk_bytes: size of each ranged GET; a failed chunk is retried alone.
      pin_s: the longest a shard handed to ``tf.data`` stays protected from eviction when its
        reader neither finishes it nor is seen holding it open (an abandoned iterator).
      wait_timeout_s: how long ``tf.data`` waits for one shard before failing.
      poll_interval_s: how often ``tf.data`` and the scanner look at the marker files.
      retry: retry policy of the object-store calls.
    """

    cache_dir: str
    cache_bytes: int = DEFAULT_CACHE_BYTES
    download_ahead: int = 8
    download_threads: int = 4
    chunk_bytes: int = 8 << 20
    pin_s: float = 60.0
    wait_timeout_s: float = 1800.0
    poll_interval_s: float = 0.005
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.cache_dir, str) or not self.cache_dir:
            raise ValueError(f"cache_dir must be a non-empty path, got {self.cache_dir!r}")
        if "://" in self.cache_dir or _GLOB_CHARS & set(self.cache_dir):
            raise ValueError(
                f"cache_dir must be a local path without glob characters {sorted(_GLOB_CHARS)}, "
                f"got {self.cache_dir!r}"
            )
        for name in ("cache_bytes", "chunk_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("download_ahead", "download_threads"):
            value = getattr(self, name)
            minimum = 0 if name == "download_ahead" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        for name in ("pin_s", "wait_timeout_s", "poll_interval_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")


@dataclasses.dataclass
class CacheStats:
    """Counters of one cache, for logs, tests and benchmarks."""

    hits: int = 0
    downloads: int = 0
    bytes_downloaded: int = 0
    evictions: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def default_cache_dir(source: str) -> str:
    """The cache directory used for ``source`` when none is given.

    ``$TFRECORD_IO_CACHE_DIR`` (or ``~/.cache/tfrecord_io``) / a hash of the source URI, so that a
    restarted process finds the same directory: an exact resume reopens the same local paths.
    """
    base = os.environ.get("TFRECORD_IO_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfrecord_io"
    )
    digest = hashlib.sha256(source.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(base, digest)


def default_cache_bytes() -> int:
    """``$TFRECORD_IO_CACHE_BYTES`` if set, else ``DEFAULT_CACHE_BYTES`` (10 GiB).

    Raises:
      ValueError: if the variable is not a positive integer.
    """
    text = os.environ.get("TFRECORD_IO_CACHE_BYTES")
    if not text:
        return DEFAULT_CACHE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"TFRECORD_IO_CACHE_BYTES must be a positive integer, got {text!r}")
    return value


# States of a shard in the cache.
_QUEUED, _DOWNLOADING, _READY, _FAILED = "queued", "downloading", "ready", "failed"


@dataclasses.dataclass
class _Entry:
    shard: RemoteShard
    name: str
    state: str = ""
    needed: bool = False  # a reader asked for it (not only announced ahead)
    last_use: float = 0.0
    announced: float = 0.0
    waiting: list[str] = dataclasses.field(default_factory=list)  # request ids awaiting it
    pins: dict[str, float] = dataclasses.field(default_factory=dict)  # request id -> lapse time
    error: str = ""
    failure: Exception | None = None
    size: int = 0


_NO_ENTRY = _Entry(shard=None, name="")  # type: ignore[arg-type]
_FETCH_ID = "fetch"  # the request id of Python callers (fetch / release)


def _after(op: Any, value: tf.Tensor) -> tf.Tensor:
    """``value``, computed after ``op`` has run."""
    import tensorflow as tf

    with tf.control_dependencies([op]):
        return tf.identity(value)


def _present(path: tf.Tensor) -> tf.Tensor:
    import tensorflow as tf

    return tf.greater(tf.size(tf.io.matching_files(path)), 0)


def _local_name_graph(uri: tf.Tensor) -> tf.Tensor:
    """The cache file name of a shard URI, in graph ops (Python uses the same ops, eagerly)."""
    import tensorflow as tf

    digest = tf.strings.to_hash_bucket_strong(uri, _HASH_BUCKETS, key=list(_HASH_KEY))
    base = tf.strings.regex_replace(uri, r"^.*/", "")
    base = tf.strings.regex_replace(base, r"[^A-Za-z0-9._-]", "_")
    base = tf.strings.substr(base, 0, 80)
    return tf.strings.join([tf.strings.as_string(digest), "-", base])


class _DirectoryWatch:
    """Wakes the scanner as soon as a marker is written (Linux inotify through ctypes), so a
    reader's request is answered in well under a millisecond. Elsewhere the scanner polls."""

    _IN_CLOSE_WRITE = 0x00000008
    _IN_MOVED_TO = 0x00000080

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def open(cls, directory: str) -> _DirectoryWatch | None:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return None
            mask = cls._IN_CLOSE_WRITE | cls._IN_MOVED_TO
            if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
                os.close(fd)
                return None
        except (OSError, AttributeError):
            return None
        return cls(fd)

    def wait(self, timeout_s: float) -> None:
        import select

        ready, _, _ = select.select([self._fd], [], [], timeout_s)
        if ready:
            try:
                while os.read(self._fd, 65536):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        os.close(self._fd)


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


class ShardCache:
    """A bounded, download-ahead, SHA-checked cache of remote shard files.

    Use ``open_cache`` to get one: there is one per cache directory per process.

    Args:
      config: the cache configuration.
      shards: shards to register (more can be added with ``register``).

    Raises:
      ValueError: if ``cache_bytes`` is smaller than the largest shard.
      CacheDirInUseError: if another process holds ``cache_dir``.
    """

    def __init__(self, config: CacheConfig, shards: Iterable[RemoteShard] = ()) -> None:
        self.config = config
        self.stats = CacheStats()
        self._dir = os.path.abspath(config.cache_dir)
        self._dirs = {
            k: os.path.join(self._dir, k)
            for k in ("shards", "meta", "tmp", "requests", "acks", "errors")
        }
        self._lock = threading.Condition()
        self._entries: dict[str, _Entry] = {}  # by local name
        self._by_uri: dict[str, _Entry] = {}
        self._queue: list[tuple[int, int, str]] = []  # (priority, seq, name)
        self._seq = itertools.count()
        self._reserved = 0
        self._last_fd_scan = 0.0
        self._stop = threading.Event()
        shards = list(shards)
        self._check_fits(shards)
        self._lock_file = self._acquire_dir()
        self._used = self._index_existing()
        self.register(shards)
        self._threads = [
            threading.Thread(target=self._scan_loop, name="shard-cache-scan", daemon=True)
        ] + [
            threading.Thread(target=self._download_loop, name=f"shard-cache-dl-{i}", daemon=True)
            for i in range(config.download_threads)
        ]
        for t in self._threads:
            t.start()

    # -- set-up -----------------------------------------------------------------------------------

    def _acquire_dir(self) -> Any:
        os.makedirs(self._dir, exist_ok=True)
        lock_file = open(os.path.join(self._dir, ".lock"), "a+")  # noqa: SIM115 - held open
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            raise CacheDirInUseError(
                f"cache_dir {self._dir} is in use by another process; give each process its own "
                f"cache_dir"
            ) from None
        # Markers, acks and partial downloads of a previous process mean nothing now.
        for key in ("tmp", "requests", "acks", "errors"):
            shutil.rmtree(self._dirs[key], ignore_errors=True)
        for path in self._dirs.values():
            os.makedirs(path, exist_ok=True)
        return lock_file

    def _index_existing(self) -> int:
        """Adopts verified files left by an earlier run; deletes anything unverified."""
        used = 0
        for entry in os.scandir(self._dirs["shards"]):
            meta_path = os.path.join(self._dirs["meta"], entry.name + ".json")
            try:
                with open(meta_path, encoding="utf-8") as f:
                    meta = json.load(f)
                shard = RemoteShard(meta["uri"], int(meta["num_bytes"]), meta.get("sha256"))
                size = entry.stat().st_size
                if size != shard.num_bytes:
                    raise ValueError("size differs")
            except (OSError, ValueError, KeyError, TypeError):
                self._remove_files(entry.name)
                continue
            e = _Entry(shard, entry.name, _READY, needed=True, size=size)
            # Older than anything used in this run (monotonic clock), in file-time order.
            e.last_use = entry.stat().st_mtime - 4e9
            self._entries[entry.name] = e
            self._by_uri[shard.uri] = e
            used += size
        for entry in os.scandir(self._dirs["meta"]):
            if entry.name[: -len(".json")] not in self._entries:
                os.unlink(entry.path)
        return used

    def register(self, shards: Iterable[RemoteShard]) -> None:
        """Makes shards known to the cache (their sizes and hashes come from the manifest).

        Raises:
          ValueError: if a shard is larger than ``cache_bytes`` (naming it), or a URI is
            registered twice with different contents.
        """
        with self._lock:
            shards = [s for s in shards if self._by_uri.get(s.uri, _NO_ENTRY).shard != s]
        if not shards:
            return
        self._check_fits(shards)
        names = self.local_names([s.uri for s in shards])
        with self._lock:
            for shard, name in zip(shards, names, strict=True):
                known = self._by_uri.get(shard.uri)
                if known is not None and known.shard == shard:
                    continue
                if known is not None and known.state != _READY:
                    raise ValueError(
                        f"{shard.uri} is registered twice with different size or SHA-256"
                    )
                if known is not None:  # stale copy of an object that has since changed
                    self._drop(known)
                entry = _Entry(shard, name)
                self._entries[name] = entry
                self._by_uri[shard.uri] = entry

    def _check_fits(self, shards: Sequence[RemoteShard]) -> None:
        if not shards:
            return
        largest = max(shards, key=lambda s: s.num_bytes)
        if largest.num_bytes > self.config.cache_bytes:
            raise ValueError(
                f"cache_bytes={self.config.cache_bytes} is smaller than the largest shard, "
                f"{redact(largest.uri)} ({largest.num_bytes} bytes); give the cache at least "
                f"{largest.num_bytes} bytes (better: cycle_length + download_ahead shards' worth)"
            )

    @staticmethod
    def local_names(uris: Sequence[str]) -> list[str]:
        """Cache file names of ``uris`` (stable across processes)."""
        import tensorflow as tf

        if not uris:
            return []
        with tf.init_scope():  # eager even when called while a tf.data function is traced
            return [n.decode() for n in _local_name_graph(tf.constant(list(uris))).numpy()]

    # -- tf.data side -------------------------------------------------------------------------------

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
            marker = tf.strings.join([requests_dir, "/", _local_name_graph(uri), ".ahead.0"])
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

        name = _local_name_graph(uri)
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
        self, uri: tf.Tensor, buffer_size: int | None, skip_failed: bool
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
        return tf.data.TFRecordDataset(names, buffer_size=buffer_size).concatenate(finished)

    def records(
        self, uri: tf.Tensor, buffer_size: int | None = None, *, skip_failed: bool = False
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

        Raises (when run):
          tf.errors.InvalidArgumentError: with the cache's message naming the URI, if the
            shard could not be downloaded or verified (unless ``skip_failed``).
        """
        import tensorflow as tf

        _, failed, message = self._until_present(uri)
        if skip_failed:
            # A failed shard reads as empty: the first read finds the error marker.
            with tf.control_dependencies([failed]):
                return self._pinned_records(uri, buffer_size, skip_failed=True)
        check = tf.debugging.Assert(tf.logical_not(failed), ["shard cache:", message], summarize=1)
        with tf.control_dependencies([check]):
            return self._pinned_records(uri, buffer_size, skip_failed=False)

    # -- Python side --------------------------------------------------------------------------------

    def fetch(self, uri: str, timeout_s: float | None = None) -> str:
        """Downloads (or finds) one registered shard and returns its verified local path.

        The shard stays pinned (not evicted) until ``release(uri)`` or for ``pin_s`` seconds.

        Raises:
          KeyError: if ``uri`` was not registered.
          ObjectStoreError: if the download failed (naming the URI).
          ShardIntegrityError: if the bytes do not match the manifest.
          TimeoutError: if it took longer than ``timeout_s`` (default ``wait_timeout_s``).
        """
        deadline = time.monotonic() + (timeout_s or self.config.wait_timeout_s)
        with self._lock:
            entry = self._by_uri.get(uri)
            if entry is None:
                raise KeyError(f"{redact(uri)} is not a shard registered with this cache")
            self._request(entry, "need", _FETCH_ID)
            while entry.state not in (_READY, _FAILED):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{redact(uri)}: not downloaded in time")
                self._lock.wait(remaining)
            if entry.state == _FAILED:
                raise _entry_error(entry)
            return os.path.join(self._dirs["shards"], entry.name)

    def release(self, uri: str) -> None:
        """Ends a pin taken by ``fetch``, so the shard may be evicted."""
        with self._lock:
            entry = self._by_uri.get(uri)
            if entry is not None:
                self._unpin(entry, _FETCH_ID)

    @property
    def used_bytes(self) -> int:
        """Bytes of shard files the cache holds now."""
        with self._lock:
            return self._used

    def cached_uris(self) -> list[str]:
        """URIs of the shards on disk now."""
        with self._lock:
            return sorted(e.shard.uri for e in self._entries.values() if e.state == _READY)

    def close(self) -> None:
        """Stops the threads and releases the directory; files stay for the next run."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for t in self._threads:
            t.join(timeout=30)
        with _caches_lock:
            if _caches.get(self._dir) is self:
                del _caches[self._dir]
        self._lock_file.close()

    # -- scanner: markers -> jobs, pins -> acks ---------------------------------------------------

    def _scan_loop(self) -> None:
        watch = _DirectoryWatch.open(self._dirs["requests"])
        try:
            while not self._stop.is_set():
                try:
                    self._scan_once()
                except Exception:  # the scanner must outlive one bad marker
                    _log.exception("shard cache scanner failed; continuing")
                if watch is not None:
                    watch.wait(self.config.poll_interval_s)
                else:
                    self._stop.wait(self.config.poll_interval_s)
        finally:
            if watch is not None:
                watch.close()

    def _scan_once(self) -> None:
        markers = []
        with os.scandir(self._dirs["requests"]) as it:
            for entry in it:
                try:
                    mtime = entry.stat().st_mtime_ns
                    os.unlink(entry.path)
                except FileNotFoundError:
                    continue
                markers.append((mtime, entry.name))
        now = time.monotonic()
        with self._lock:
            # Within one timestamp tick, requests before releases: a release always follows its
            # own request, and file times are coarse.
            for _, _, marker in sorted((t, m.rsplit(".", 2)[1] == "done", m) for t, m in markers):
                name, kind, rid = marker.rsplit(".", 2)
                entry = self._entries.get(name)
                if entry is None:
                    message = f"shard cache file {name} was requested but no shard is registered"
                    _log.error("shard cache: %s", message)
                    _write_atomic(
                        os.path.join(self._dirs["errors"], name),
                        message.encode(),
                        self._dirs["tmp"],
                    )
                    continue
                if kind == "done":
                    self._unpin(entry, rid)
                else:
                    self._request(entry, kind, rid)
            for entry in self._entries.values():
                for rid, lapse in list(entry.pins.items()):
                    if lapse <= now:
                        self._unpin(entry, rid)

    def _request(self, entry: _Entry, kind: str, rid: str = "") -> None:
        """Handles one request. Lock held.

        ``ahead``: download when there is room, evicting only shards already read. ``want`` and
        ``need``: download now, evicting if needed, and pin the file for request ``rid`` until
        its ``done`` (a ``want`` waiter only needs to see the file; a ``need`` reader opens it).
        """
        now = time.monotonic()
        urgent = kind in ("want", "need")
        if urgent:
            entry.needed = True
            entry.last_use = now
        elif not entry.announced:
            entry.announced = now
        if entry.state == _READY:
            if urgent:
                self.stats.hits += kind == "need"
                self._pin(entry, rid)
            return
        if entry.state == _FAILED:
            return
        if urgent:
            entry.waiting.append(rid)
        if entry.state == "" or (entry.state == _QUEUED and urgent):
            entry.state = _QUEUED
            entry.announced = entry.announced or now
            heapq.heappush(self._queue, (0 if urgent else 1, next(self._seq), entry.name))
            self._lock.notify_all()

    def _pin(self, entry: _Entry, rid: str) -> None:
        """Hands the file to the reader of request ``rid``: no eviction until it is done. Lock
        held."""
        entry.pins[rid] = time.monotonic() + self.config.pin_s
        if rid != _FETCH_ID:
            _write_atomic(
                os.path.join(self._dirs["acks"], f"{entry.name}.{rid}"), b"", self._dirs["tmp"]
            )

    def _unpin(self, entry: _Entry, rid: str) -> None:
        """The reader of request ``rid`` is done with the file. Lock held."""
        if entry.pins.pop(rid, None) is None:
            return
        _unlink(os.path.join(self._dirs["acks"], f"{entry.name}.{rid}"))
        if not entry.pins:
            self._lock.notify_all()

    # -- downloads ---------------------------------------------------------------------------------

    def _download_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                entry = self._next_job()
                if entry is None:
                    self._lock.wait(0.1)
                    continue
            try:
                self._download(entry)
            except Exception as e:  # recorded on the entry and reported to the reader
                self._fail(entry, e)

    def _next_job(self) -> _Entry | None:
        """Pops the most urgent job that has room, reserving its bytes. Lock held."""
        while self._queue:
            priority, _, name = self._queue[0]
            entry = self._entries[name]
            if entry.state != _QUEUED:
                heapq.heappop(self._queue)  # duplicate of an upgraded or finished job
                continue
            if not self._make_room(entry.shard.num_bytes, for_need=(priority == 0)):
                return None  # back-pressure: wait for reads to finish or pins to expire
            heapq.heappop(self._queue)
            entry.state = _DOWNLOADING
            self._reserved += entry.shard.num_bytes
            return entry
        return None

    def _make_room(self, size: int, *, for_need: bool) -> bool:
        """Evicts until ``size`` more bytes fit. Lock held.

        Shards already handed to a reader go first, least recently used first. Shards only
        announced ahead are evicted for a shard needed now, the one announced last (needed
        furthest in the future) first; a download ahead never evicts them. Pinned shards are
        skipped unless this process already has them open.
        """
        limit = self.config.cache_bytes
        if self._used + self._reserved + size <= limit:
            return True
        victims = self._victims(for_need)
        if self._used + self._reserved + size - sum(e.size for e in victims) > limit:
            if not self._release_open_pins():
                return False
            victims = self._victims(for_need)
            if self._used + self._reserved + size - sum(e.size for e in victims) > limit:
                return False
        for victim in victims:
            if self._used + self._reserved + size <= limit:
                break
            self._evict(victim)
        return True

    def _victims(self, for_need: bool) -> list[_Entry]:
        ready = [e for e in self._entries.values() if e.state == _READY and not e.pins]
        victims = sorted((e for e in ready if e.needed), key=lambda e: e.last_use)
        if for_need:
            victims += sorted(
                (e for e in ready if not e.needed), key=lambda e: e.announced, reverse=True
            )
        return victims

    def _release_open_pins(self) -> bool:
        """Unpins shards that this process holds open. Lock held.

        Rate-limited: listing /proc/self/fd costs about a millisecond. Returns whether anything
        was unpinned.
        """
        now = time.monotonic()
        if now - self._last_fd_scan < 0.05 or not os.path.isdir("/proc/self/fd"):
            return False
        self._last_fd_scan = now
        open_paths = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                open_paths.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                continue
        released = False
        for entry in self._entries.values():
            # With one reader, an open file means that reader is past the race; with more, one
            # of them may not have opened it yet.
            path = os.path.join(self._dirs["shards"], entry.name)
            if len(entry.pins) == 1 and path in open_paths:
                self._unpin(entry, next(iter(entry.pins)))
                released = True
        return released

    def _evict(self, entry: _Entry) -> None:
        self._remove_files(entry.name)
        self._used -= entry.size
        for rid in list(entry.pins):
            self._unpin(entry, rid)
        entry.state, entry.size = "", 0
        entry.needed = False
        entry.announced = 0.0
        self.stats.evictions += 1

    def _drop(self, entry: _Entry) -> None:
        if entry.state == _READY:
            self._evict(entry)
        del self._entries[entry.name]
        self._by_uri.pop(entry.shard.uri, None)

    def _remove_files(self, name: str) -> None:
        for key, suffix in (("shards", ""), ("meta", ".json")):
            _unlink(os.path.join(self._dirs[key], name + suffix))

    def _download(self, entry: _Entry) -> None:
        shard = entry.shard
        tmp = os.path.join(self._dirs["tmp"], entry.name)
        try:
            store = get_store(shard.uri, self.config.retry)
            digest = store.download(
                shard.uri, tmp, expected_size=shard.num_bytes, chunk_bytes=self.config.chunk_bytes
            )
            if shard.sha256 is not None and digest != shard.sha256:
                raise ShardIntegrityError(
                    f"{shard.uri}: SHA-256 mismatch: dataset.json says {shard.sha256}, the "
                    f"downloaded bytes hash to {digest}; the object changed or was corrupted "
                    f"after the dataset was published. The bad copy was removed.",
                    uri=shard.uri,
                )
            _write_atomic(
                os.path.join(self._dirs["meta"], entry.name + ".json"),
                json.dumps(dataclasses.asdict(shard)).encode(),
                self._dirs["tmp"],
            )
            os.replace(tmp, os.path.join(self._dirs["shards"], entry.name))
        finally:
            _unlink(tmp)
        with self._lock:
            self._reserved -= shard.num_bytes
            self._used += shard.num_bytes
            entry.state, entry.size = _READY, shard.num_bytes
            entry.last_use = time.monotonic()
            self.stats.downloads += 1
            self.stats.bytes_downloaded += shard.num_bytes
            for rid in entry.waiting:
                self._pin(entry, rid)
            entry.waiting = []
            self._lock.notify_all()

    def _fail(self, entry: _Entry, exc: Exception) -> None:
        if isinstance(exc, (ObjectStoreError, ShardIntegrityError)):
            message = str(exc)
        else:
            message = f"{entry.shard.uri}: download failed: {type(exc).__name__}: {exc}"
        message = redact(message)
        _log.error("shard cache: %s", message)
        _write_atomic(
            os.path.join(self._dirs["errors"], entry.name), message.encode(), self._dirs["tmp"]
        )
        with self._lock:
            if entry.state == _DOWNLOADING:
                self._reserved -= entry.shard.num_bytes
            entry.state, entry.error = _FAILED, message
            entry.failure = exc
            self.stats.failures += 1
            self._lock.notify_all()


def _entry_error(entry: _Entry) -> Exception:
    if isinstance(entry.failure, (ObjectStoreError, ShardIntegrityError)):
        return entry.failure
    return ObjectStoreError(entry.error, uri=entry.shard.uri)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write_atomic(path: str, data: bytes, tmp_dir: str) -> None:
    tmp = os.path.join(tmp_dir, f".{os.path.basename(path)}.{threading.get_ident()}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


_caches: dict[str, ShardCache] = {}
_caches_lock = threading.Lock()


def open_cache(config: CacheConfig, shards: Iterable[RemoteShard] = ()) -> ShardCache:
    """The process's cache for ``config.cache_dir``, created on first use; registers ``shards``.

    Raises:
      ValueError: if the directory is already open with a different configuration, or a shard
        is larger than ``cache_bytes``.
      CacheDirInUseError: if another process holds the directory.
    """
    key = os.path.abspath(config.cache_dir)
    with _caches_lock:
        cache = _caches.get(key)
        if cache is None:
            cache = ShardCache(config, shards)
            _caches[key] = cache
            return cache
    if cache.config != config:
        raise ValueError(
            f"cache_dir {key} is already open in this process with {cache.config}; got a "
            f"different configuration {config}"
        )
    cache.register(shards)
    return cache


_MAX_SLOTS = 16


def open_default_cache(source: str, shards: Iterable[RemoteShard] = ()) -> ShardCache:
    """The cache of ``source`` in its default directory (``default_cache_dir``).

    When another process holds that directory (two input pipelines on one host), the first free
    of ``<dir>-1``, ``<dir>-2``… is used. ``cache_bytes`` comes from ``default_cache_bytes``.

    Raises:
      ValueError: if a shard is larger than the cache.
      CacheDirInUseError: if every slot is held by another process.
    """
    base = default_cache_dir(source)
    cache_bytes = default_cache_bytes()
    for slot in range(_MAX_SLOTS):
        config = CacheConfig(
            cache_dir=base if slot == 0 else f"{base}-{slot}", cache_bytes=cache_bytes
        )
        try:
            return open_cache(config, shards)
        except CacheDirInUseError:
            continue
    raise CacheDirInUseError(
        f"all {_MAX_SLOTS} default cache directories {base}[-N] of {redact(source)} are in use; "
        f"pass a cache directory explicitly"
    )
