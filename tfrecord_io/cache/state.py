"""The Python side of the shard cache: the state machine (protocol in ``tfrecord_io.cache``).

A scanner thread turns the markers ``tf.data`` writes into download jobs and pins; download
threads fetch shards (checked against ``dataset.json``) within ``cache_bytes``, evicting shards
already read, least recently used first; pins keep a shard on disk while a reader needs it.
``ShardCache`` adds this to the graph side it inherits from ``GraphHandoff``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import heapq
import itertools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from objstore import ObjectStoreError, get_store, redact, write_atomic
from tfrecord_io.cache.config import (
    CacheConfig,
    CacheDirInUseError,
    CacheStats,
    RemoteShard,
    ShardIntegrityError,
    default_cache_bytes,
    default_cache_dir,
)
from tfrecord_io.cache.handoff import GraphHandoff
from tfrecord_io.cache.names import INTEGRITY_FAILURE, NOT_REGISTERED, requester_pid
from tfrecord_io.cache.watch import DirectoryWatch

__all__ = ["ShardCache", "open_cache", "open_default_cache"]

_log = logging.getLogger("tfrecord_io.cache")

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


_FETCH_ID = "fetch"  # the request id of Python callers (fetch / release)


class ShardCache(GraphHandoff):
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
        # Opened here, before the threads start: a thread of ours still opening it while the
        # caller forks (a DataLoader starting its workers) would fork in the middle of it.
        watch = DirectoryWatch.open(self._dirs["requests"])
        self._threads = [
            threading.Thread(
                target=self._scan_loop, args=(watch,), name="shard-cache-scan", daemon=True
            )
        ] + [
            threading.Thread(target=self._download_loop, name=f"shard-cache-dl-{i}", daemon=True)
            for i in range(config.download_threads)
        ]
        for t in self._threads:
            t.start()

    # -- set-up -----------------------------------------------------------------------------------

    def _acquire_dir(self) -> Any:
        os.makedirs(self._dir, exist_ok=True)
        lock_file = open(os.path.join(self._dir, ".lock"), "a+")  # held open
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
            shards = [s for s in shards if (e := self._by_uri.get(s.uri)) is None or e.shard != s]
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
                # An earlier request for it, before it was registered, left "no shard is
                # registered": that is no longer true.
                _unlink(os.path.join(self._dirs["errors"], name))

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

    def _scan_loop(self, watch: DirectoryWatch | None) -> None:
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
            for marker_file in it:
                try:
                    mtime = marker_file.stat().st_mtime_ns
                    os.unlink(marker_file.path)
                except FileNotFoundError:
                    continue
                markers.append((mtime, marker_file.name))
        now = time.monotonic()
        with self._lock:
            # Within one timestamp tick, requests before releases: a release always follows its
            # own request, and file times are coarse.
            for _, _, marker in sorted((t, m.rsplit(".", 2)[1] == "done", m) for t, m in markers):
                name, kind, rid = marker.rsplit(".", 2)
                entry = self._entries.get(name)
                if entry is None:
                    message = f"shard cache file {name} {NOT_REGISTERED}"
                    _log.error("shard cache: %s", message)
                    write_atomic(
                        os.path.join(self._dirs["errors"], name),
                        message.encode(),
                        tmp_dir=self._dirs["tmp"],
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
            write_atomic(
                os.path.join(self._dirs["acks"], f"{entry.name}.{rid}"),
                b"",
                tmp_dir=self._dirs["tmp"],
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

        A pin of a ``CacheClient`` in another process stays: this process's open file says
        nothing about that reader, which ends its pin itself right after its open.
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
                rid = next(iter(entry.pins))
                if requester_pid(rid) not in (None, os.getpid()):
                    continue
                self._unpin(entry, rid)
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
                    f"{shard.uri}: {INTEGRITY_FAILURE}: dataset.json says {shard.sha256}, the "
                    f"downloaded bytes hash to {digest}; the object changed or was corrupted "
                    f"after the dataset was published. The bad copy was removed.",
                    uri=shard.uri,
                )
            write_atomic(
                os.path.join(self._dirs["meta"], entry.name + ".json"),
                json.dumps(dataclasses.asdict(shard)).encode(),
                tmp_dir=self._dirs["tmp"],
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
        write_atomic(
            os.path.join(self._dirs["errors"], entry.name),
            message.encode(),
            tmp_dir=self._dirs["tmp"],
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


_caches: dict[str, ShardCache] = {}
_caches_lock = threading.Lock()


def _forget_inherited_caches() -> None:
    """In a forked child: the parent's caches have no threads here, and the parent still owns
    their directories, so ``open_cache`` must not hand them out (a DataLoader worker forked
    from a rank that owns the cache is a client of it)."""
    global _caches_lock
    _caches.clear()
    _caches_lock = threading.Lock()  # it may have been held by another thread at the fork


os.register_at_fork(after_in_child=_forget_inherited_caches)


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
