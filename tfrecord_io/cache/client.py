"""A client of the shard cache for any process on the host: no TensorFlow, no threads.

One process owns a cache directory (``ShardCache``: the downloads, the pins, eviction within
``cache_bytes``). Other processes on the host, such as the worker processes of a PyTorch
``DataLoader`` or the other training ranks, read through it with a ``CacheClient``, which
speaks the same marker protocol as ``tf.data`` (see ``tfrecord_io.cache``), so the host
downloads each shard once, checked against ``dataset.json``:

1. ``announce(uris)`` writes ``requests/<name>.ahead.0``: the owner downloads those shards when
   there is room, in the order announced, and pins nothing.
2. ``open(uri)`` writes ``requests/<name>.need.<id>`` with a request id unique on the host
   (pid, a counter and a random token), and waits until the owner acks it with
   ``acks/<name>.<id>`` (the verified file is at ``shards/<name>`` and pinned for this request)
   or reports ``errors/<name>``. The wait sleeps on an inotify watch of ``acks/`` (Linux), and
   looks for the error marker every ``poll_interval_s``; without inotify it polls both. The
   need is written again every second in case the owner had not seen it (it clears
   ``requests/`` when it starts).
3. It opens ``shards/<name>`` and writes ``requests/<name>.done.<id>`` at once: the pin ends
   and the owner may evict the file while the caller still reads it, which is harmless on
   POSIX (the open descriptor keeps the bytes). If the file went between the ack and the open
   (the pin lapsed after ``pin_s``), it asks again.

**Errors** come from the owner's error marker, whose text names the URI: ``KeyError`` for a
shard the owner has not registered, ``ShardIntegrityError`` for bytes that do not match the
manifest, ``ObjectStoreError`` for a failed download. The owner does not retry a failed shard
(its retry policy already did) until it restarts, so every later ``open`` of it fails at once.

**Space.** ``cache_bytes`` bounds the files in ``shards/`` (and downloads in progress). The
owner cannot see other processes' open files, so a shard a client still holds open can be
evicted; its blocks stay allocated until the client closes it, so the disk holds up to
``cache_bytes`` plus the evicted shards that clients keep open.

**The owner must have registered every shard a client asks for**: it knows a shard's size
and SHA-256 only from the manifest, and answers a request for an unknown shard with an error
marker ("requested but no shard is registered"). Every rank of a training job reads the same
split, so each calls ``open_shared_cache(config, <the whole split's shards>)``: the first
becomes the owner with everything registered, and the others get a client. The owner must keep
running while clients read: they time out (``TimeoutError`` naming the URI) without it.

A ``CacheClient`` pickles as its directory and its numbers, so it can be handed to worker
processes (``spawn`` or ``fork``).
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

from objstore import ObjectStoreError, is_object_store_uri, redact
from tfrecord_io.cache.config import (
    CacheConfig,
    CacheDirInUseError,
    RemoteShard,
    ShardIntegrityError,
)
from tfrecord_io.cache.names import (
    INTEGRITY_FAILURE,
    NOT_REGISTERED,
    client_request_id,
    local_name,
    local_names,
)
from tfrecord_io.cache.state import ShardCache, open_cache
from tfrecord_io.cache.watch import DirectoryWatch

__all__ = ["CacheClient", "open_shared_cache"]

_REASK_S = 1.0


class CacheClient:
    """Reads shards through the cache that another process (or this one) owns.

    Thread-safe, and picklable: it holds only the directory and its numbers; the inotify
    watch is opened again in each process that uses it.

    Args:
      cache_dir: the cache directory of the owning ``ShardCache``.
      wait_timeout_s: how long ``open`` waits for one shard (a download included).
      poll_interval_s: how often a wait looks for an error marker (and for the ack, where
        inotify is not available).

    Raises:
      ValueError: if a number is not > 0 or ``cache_dir`` is empty.
    """

    def __init__(
        self, cache_dir: str, *, wait_timeout_s: float = 1800.0, poll_interval_s: float = 0.005
    ) -> None:
        if not isinstance(cache_dir, str) or not cache_dir:
            raise ValueError(f"cache_dir must be a non-empty path, got {cache_dir!r}")
        for name, value in (
            ("wait_timeout_s", wait_timeout_s),
            ("poll_interval_s", poll_interval_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        self.cache_dir = os.path.abspath(cache_dir)
        self.wait_timeout_s = float(wait_timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        self._start()

    @classmethod
    def for_config(cls, config: CacheConfig) -> CacheClient:
        """A client of the cache ``config`` describes, with its wait timeout and poll interval."""
        return cls(
            config.cache_dir,
            wait_timeout_s=config.wait_timeout_s,
            poll_interval_s=config.poll_interval_s,
        )

    def _start(self) -> None:
        """Sets up the per-process state: not pickled, and set up again after a fork."""
        self._dirs = {
            k: os.path.join(self.cache_dir, k) for k in ("shards", "requests", "acks", "errors")
        }
        self._pid = os.getpid()
        self._counter = itertools.count()
        self._token = secrets.token_hex(4)
        self._watch_lock = threading.Lock()
        self._watch: DirectoryWatch | None = None
        self._watch_inode: int | None = None  # of the acks/ the watch was opened on

    def _in_this_process(self) -> None:
        if self._pid != os.getpid():  # forked: the lock may be held, the watch is the parent's
            if self._watch is not None:
                self._watch.close()  # this process's copy of the descriptor only
            self._start()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "cache_dir": self.cache_dir,
            "wait_timeout_s": self.wait_timeout_s,
            "poll_interval_s": self.poll_interval_s,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    def __repr__(self) -> str:
        return (
            f"CacheClient({self.cache_dir!r}, wait_timeout_s={self.wait_timeout_s:g}, "
            f"poll_interval_s={self.poll_interval_s:g})"
        )

    # -- public -----------------------------------------------------------------------------

    def announce(self, uris: Sequence[str]) -> None:
        """Asks the owner to download ``uris`` ahead, in this order, when there is room.

        Nothing is pinned: an announced shard waits on disk for its ``open``, and may be evicted
        for a shard needed now. Announce the next few shards in read order (the owner's
        ``download_ahead``), not a whole epoch.

        Raises:
          ValueError: if a URI is not an ``s3://`` or ``gs://`` URI.
          FileNotFoundError: if ``cache_dir`` has never been opened by an owner.
        """
        for uri in uris:
            self._check_uri(uri)
        self._check_dir()
        for name in local_names(uris):
            self._mark(name, "ahead", "0")

    def open(self, uri: str) -> BinaryIO:
        """Opens the verified local copy of shard ``uri``, downloading it first if needed.

        Returns a file object open for binary reading; the caller closes it. The file stays
        readable until then even if the cache evicts it.

        Raises:
          ValueError: if ``uri`` is not an ``s3://`` or ``gs://`` URI.
          KeyError: if the owner has no such shard registered (naming the URI).
          ShardIntegrityError: if the downloaded bytes do not match the manifest.
          ObjectStoreError: if the download failed (the owner's message, naming the URI).
          TimeoutError: if no answer came within ``wait_timeout_s`` (naming the URI).
          FileNotFoundError: if ``cache_dir`` has never been opened by an owner.
        """
        self._check_uri(uri)
        self._check_dir()
        name = local_name(uri)
        deadline = time.monotonic() + self.wait_timeout_s
        while True:
            rid = self._request_id()
            try:
                self._wait_for_ack(uri, name, rid, deadline)
                try:
                    return open(os.path.join(self._dirs["shards"], name), "rb")
                except FileNotFoundError:
                    # Unpinned and evicted before the open (the pin lapsed): ask again.
                    if time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"{redact(uri)}: evicted before it could be opened, again, for "
                            f"{self.wait_timeout_s:g}s (is pin_s of the cache in "
                            f"{self.cache_dir} too short?)"
                        ) from None
                    continue
            finally:
                # Right after the open, or to cancel: the pin ends, the open file stays usable.
                self._mark(name, "done", rid)

    def close(self) -> None:
        """Closes this process's inotify watch (the client still works, polling or reopening
        it); idempotent."""
        self._in_this_process()
        with self._watch_lock:
            if self._watch is not None:
                self._watch.close()
            self._watch, self._watch_inode = None, None

    # -- the wait ---------------------------------------------------------------------------

    def _wait_for_ack(self, uri: str, name: str, rid: str, deadline: float) -> None:
        """Writes the need for ``rid`` and waits for its ack. Raises the error marker's failure,
        or ``TimeoutError`` at ``deadline``."""
        ack = os.path.join(self._dirs["acks"], f"{name}.{rid}")
        error = os.path.join(self._dirs["errors"], name)
        watch = self._acks_watch()  # before the need: an ack written after it wakes the watch
        self._mark(name, "need", rid)
        asked = time.monotonic()
        while True:
            if os.path.exists(ack):
                return
            if os.path.exists(error):
                raise self._failure(uri, error)
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(
                    f"{redact(uri)}: not ready within {self.wait_timeout_s:g}s from the shard "
                    f"cache in {self.cache_dir} (is the process that owns it, the first to call "
                    f"open_shared_cache, still running?)"
                )
            if now - asked >= _REASK_S:
                self._mark(name, "need", rid)
                asked = now
            wait_s = min(self.poll_interval_s, deadline - now)
            if watch is not None:
                watch.wait(wait_s)
            else:
                time.sleep(wait_s)

    def _failure(self, uri: str, error_path: str) -> Exception:
        try:
            with open(error_path, encoding="utf-8", errors="replace") as f:
                text = redact(f.read().strip())
        except OSError as e:
            text = f"failed (the error marker could not be read: {e})"
        shown = redact(uri)
        if NOT_REGISTERED in text:
            return KeyError(
                f"{shown} is not a shard registered with the shard cache in {self.cache_dir}: the "
                f"owner registers the shards clients ask for (open_shared_cache(config, shards) "
                f"with the whole split in every process). The owner said: {text}"
            )
        if shown not in text:
            text = f"{shown}: {text}"
        if INTEGRITY_FAILURE in text:
            return ShardIntegrityError(text, uri=uri)
        return ObjectStoreError(text, uri=uri)

    def _acks_watch(self) -> DirectoryWatch | None:
        """This process's inotify watch of ``acks/``, reopened after a fork or when an owner
        has recreated the directory; None where inotify is not available."""
        self._in_this_process()
        try:
            inode = os.stat(self._dirs["acks"]).st_ino
        except FileNotFoundError:
            return None
        with self._watch_lock:
            if inode != self._watch_inode:
                if self._watch is not None:
                    self._watch.close()
                self._watch = DirectoryWatch.open(self._dirs["acks"])
                self._watch_inode = inode
            return self._watch

    # -- markers ----------------------------------------------------------------------------

    def _request_id(self) -> str:
        self._in_this_process()
        return client_request_id(next(self._counter), self._token)

    def _mark(self, name: str, kind: str, rid: str) -> None:
        """Writes the marker ``requests/<name>.<kind>.<rid>``. Only its name matters, so a plain
        create is enough; if the owner is recreating ``requests/`` the re-ask repeats it."""
        try:
            with open(os.path.join(self._dirs["requests"], f"{name}.{kind}.{rid}"), "wb"):
                pass
        except FileNotFoundError:
            pass

    def _check_dir(self) -> None:
        if not os.path.exists(os.path.join(self.cache_dir, ".lock")):
            raise FileNotFoundError(
                f"{self.cache_dir} is not a shard cache directory: no owner has opened it (call "
                f"open_shared_cache or open_cache with this cache_dir first)"
            )

    @staticmethod
    def _check_uri(uri: str) -> None:
        if not isinstance(uri, str) or not is_object_store_uri(uri):
            raise ValueError(f"expected an s3:// or gs:// shard URI, got {redact(uri)!r}")


def open_shared_cache(
    config: CacheConfig, shards: Iterable[RemoteShard] = ()
) -> tuple[ShardCache | None, CacheClient]:
    """Opens the host's cache of ``config.cache_dir`` as its owner if no other process owns it,
    and a client of it in any case: several processes on a host share one cache.

    The owner (the ``ShardCache``, whose threads download, verify and evict) answers every
    process's ``CacheClient``, and knows only the shards registered with it, so every process
    passes all the shards any of them may read (every rank of a training job: the whole
    split's). The owner must keep running (not ``close`` the cache) while clients read.

    Args:
      config: the cache configuration; the owner's is the one in force.
      shards: the shards to register if this process becomes (or is) the owner.

    Returns:
      (the ``ShardCache`` if this process owns the directory, else None; a ``CacheClient`` of
      the directory, picklable, for this process and its workers).

    Raises:
      ValueError: if a shard is larger than ``cache_bytes``, or this process has the directory
        open with a different configuration.
    """
    shards = list(shards)
    try:
        cache: ShardCache | None = open_cache(config, shards)
    except CacheDirInUseError:
        cache = None
    return cache, CacheClient.for_config(config)
