"""``CacheClient``: other processes on the host read through one owner's shard cache, against a
real S3 API server (moto) on loopback.

The owner (``ShardCache``) lives in the test process; clients run in processes started with
``spawn`` (a fresh interpreter, as a PyTorch ``DataLoader`` with that start method) or ``fork``
(the Linux default), and never import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from objstore import ObjectStoreError, RetryPolicy
from tests.fixtures.object_store import BucketEnv, upload_tree
from tests.fixtures.shards import WrittenDataset
from tfrecord_io.cache import (
    CacheClient,
    CacheConfig,
    RemoteShard,
    ShardCache,
    ShardIntegrityError,
    local_name,
    open_cache,
    open_shared_cache,
)
from tfrecord_io.cache.names import requester_pid
from tfrecord_io.cache.watch import DirectoryWatch

_FAST_RETRY = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=10)
_CHILD_TIMEOUT_S = 60.0


def _config(tmp_path: Path, **overrides: Any) -> CacheConfig:
    values: dict[str, Any] = {
        "cache_dir": str(tmp_path / "cache"),
        "cache_bytes": 1 << 20,
        "retry": _FAST_RETRY,
        "poll_interval_s": 0.002,
        "wait_timeout_s": 30.0,
    }
    values.update(overrides)
    return CacheConfig(**values)


def _remote_shards(dataset: WrittenDataset, root: str) -> list[RemoteShard]:
    return [
        RemoteShard(f"{root}/{s.file}", s.num_bytes, s.sha256)
        for s in dataset.manifest.split("train").shards
    ]


def _digests(dataset: WrittenDataset) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in dataset.shard_paths("train")]


@pytest.fixture()
def owner() -> Iterator[Callable[..., tuple[ShardCache, CacheClient]]]:
    """``owner(config, shards)``: ``open_shared_cache`` in the test process, which must become
    the owner; the cache is closed after the test."""
    opened: list[ShardCache] = []

    def make(config: CacheConfig, shards: list[RemoteShard]) -> tuple[ShardCache, CacheClient]:
        cache, client = open_shared_cache(config, shards)
        assert cache is not None, "the test process should own the cache directory"
        opened.append(cache)
        return cache, client

    yield make
    for cache in opened:
        cache.close()


@pytest.fixture(scope="module")
def six_shards(tmp_path_factory: pytest.TempPathFactory) -> WrittenDataset:
    """24 small examples in 6 train shards; read-only."""
    from tests.fixtures.shards import write_dataset

    return write_dataset(
        tmp_path_factory.mktemp("six") / "ds",
        examples={"train": 24},
        num_shards={"train": 6},
        image_size=32,
    )


# -- what the client processes run (module level: ``spawn`` imports them by name) ------------


def _read_shards(client: CacheClient, uris: list[str]) -> list[str]:
    digests = []
    for uri in uris:
        with client.open(uri) as f:
            digests.append(hashlib.sha256(f.read()).hexdigest())
    return digests


def _read_holding_the_first_open(client: CacheClient, uris: list[str]) -> list[str]:
    """Opens the first shard, reads all the others (so the cache evicts the first), then reads
    the first through the descriptor it kept."""
    with client.open(uris[0]) as first:
        rest = _read_shards(client, uris[1:])
        return [hashlib.sha256(first.read()).hexdigest(), *rest]


def _after_the_barrier(barrier: Any, config: CacheConfig, uri: str) -> dict[str, Any]:
    cache, client = open_shared_cache(config)  # forked from the owner: a client only
    barrier.wait(timeout=_CHILD_TIMEOUT_S)
    return {"owner": cache is not None, "digests": _read_shards(client, [uri])}


def _child(queue: Any, index: int, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        result: dict[str, Any] = {"value": target(*args)}
    except Exception as e:  # reported to the test, which shows it
        result = {"error": f"{type(e).__name__}: {e}"}
    result["tensorflow"] = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow")
    queue.put((index, result))


def _in_processes(method: str, target: Callable[..., Any], *arg_lists: tuple[Any, ...]) -> list:
    """Runs ``target(*args)`` for each ``args`` in its own process (``spawn`` or ``fork``);
    returns each result dict: ``value`` or ``error``, and the TensorFlow modules it loaded."""
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    processes = [
        ctx.Process(target=_child, args=(queue, i, target, args), daemon=True)
        for i, args in enumerate(arg_lists)
    ]
    for process in processes:
        process.start()
    try:
        results = dict(queue.get(timeout=_CHILD_TIMEOUT_S) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return [results[i] for i in range(len(processes))]


# -- tests -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_client_in_another_process_gets_verified_shards(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path, owner: Callable
) -> None:
    upload_tree(jpeg_dataset.root, s3_env.root)
    shards = _remote_shards(jpeg_dataset, s3_env.root)
    cache, client = owner(_config(tmp_path), shards)

    [result] = _in_processes("spawn", _read_shards, (client, [s.uri for s in shards]))

    assert result.get("value") == _digests(jpeg_dataset), result
    assert result["tensorflow"] == []
    assert cache.stats.downloads == len(shards) and cache.stats.failures == 0
    # Every pin ended with the client's done marker; nothing is left behind.
    _wait_until(lambda: not os.listdir(tmp_path / "cache" / "acks"))
    assert not os.listdir(tmp_path / "cache" / "requests")


@pytest.mark.slow
def test_two_clients_in_two_processes_share_one_download(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path, owner: Callable
) -> None:
    upload_tree(jpeg_dataset.root, s3_env.root)
    shards = _remote_shards(jpeg_dataset, s3_env.root)
    config = _config(tmp_path)
    cache, _ = owner(config, shards)
    barrier = multiprocessing.get_context("fork").Barrier(2)

    results = _in_processes(
        "fork",
        _after_the_barrier,
        (barrier, config, shards[2].uri),
        (barrier, config, shards[2].uri),
    )

    expected = {"owner": False, "digests": [_digests(jpeg_dataset)[2]]}
    assert [r.get("value") for r in results] == [expected, expected], results
    assert cache.stats.downloads == 1
    assert cache.cached_uris() == [shards[2].uri]


def test_a_shard_that_does_not_match_the_manifest_fails_naming_the_uri(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path, owner: Callable
) -> None:
    upload_tree(jpeg_dataset.root, s3_env.root)
    good, bad = _remote_shards(jpeg_dataset, s3_env.root)[:2]
    bad = dataclasses.replace(bad, sha256="0" * 64)
    cache, client = owner(_config(tmp_path), [good, bad])

    with pytest.raises(ShardIntegrityError, match="SHA-256 mismatch") as info:
        client.open(bad.uri)
    with pytest.raises(ShardIntegrityError):  # the failure stays: no second download
        client.open(bad.uri)

    assert info.value.uri == bad.uri and bad.uri in str(info.value)
    assert cache.stats.failures == 1 and cache.stats.downloads == 0
    assert not any(local_name(bad.uri) in p.name for p in (tmp_path / "cache" / "shards").iterdir())
    with client.open(good.uri) as f:  # the other shards are unaffected
        assert hashlib.sha256(f.read()).hexdigest() == good.sha256


def test_a_missing_object_fails_with_the_owners_message(
    s3_env: BucketEnv, tmp_path: Path, owner: Callable
) -> None:
    missing = RemoteShard(s3_env.uri("nope", "train-00000-of-00001.tfrecord"), 100, "a" * 64)
    _, client = owner(_config(tmp_path), [missing])

    with pytest.raises(ObjectStoreError, match="not found") as info:
        client.open(missing.uri)

    assert info.value.uri == missing.uri and missing.uri in str(info.value)


def test_an_unregistered_uri_fails_clearly_until_the_owner_registers_it(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path, owner: Callable
) -> None:
    upload_tree(jpeg_dataset.root, s3_env.root)
    shards = _remote_shards(jpeg_dataset, s3_env.root)
    cache, client = owner(_config(tmp_path), shards[:1])

    with pytest.raises(KeyError, match="not a shard registered") as info:
        client.open(shards[1].uri)
    assert shards[1].uri in str(info.value) and "open_shared_cache" in str(info.value)

    cache.register(shards[1:2])  # clears the owner's "no shard is registered" marker
    with client.open(shards[1].uri) as f:
        assert hashlib.sha256(f.read()).hexdigest() == shards[1].sha256


def test_a_wait_without_a_running_owner_times_out_naming_the_uri(
    s3_env: BucketEnv, tmp_path: Path
) -> None:
    shard = RemoteShard(s3_env.uri("train-00000-of-00001.tfrecord"), 100, "a" * 64)
    config = _config(tmp_path)
    open_cache(config, [shard]).close()  # the directory exists, its owner is gone
    client = CacheClient(config.cache_dir, wait_timeout_s=0.3)

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="still running") as info:
        client.open(shard.uri)

    assert shard.uri in str(info.value)
    assert 0.3 <= time.monotonic() - started < 5
    with pytest.raises(FileNotFoundError, match="no owner has opened it"):
        CacheClient(str(tmp_path / "never-opened")).open(shard.uri)


@pytest.mark.slow
def test_clients_reading_more_than_fits_keep_the_cache_within_cache_bytes(
    s3_env: BucketEnv, six_shards: WrittenDataset, tmp_path: Path, owner: Callable
) -> None:
    upload_tree(six_shards.root, s3_env.root)
    shards = _remote_shards(six_shards, s3_env.root)
    config = _config(tmp_path, cache_bytes=2 * max(s.num_bytes for s in shards))
    cache, client = owner(config, shards)
    sampler = _DiskSampler(tmp_path / "cache")
    sampler.start()

    try:
        [result] = _in_processes(
            "spawn", _read_holding_the_first_open, (client, [s.uri for s in shards])
        )
    finally:
        sampler.stop()

    # The first shard was evicted while the client held it open, and still read whole.
    assert result.get("value") == _digests(six_shards), result
    assert sampler.samples > 10 and sampler.largest <= config.cache_bytes
    assert cache.used_bytes <= config.cache_bytes
    assert cache.stats.downloads == len(shards) and cache.stats.evictions >= len(shards) - 2
    assert shards[0].uri not in cache.cached_uris()


def test_announced_shards_are_downloaded_ahead_and_then_hit(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path, owner: Callable
) -> None:
    upload_tree(jpeg_dataset.root, s3_env.root)
    shards = _remote_shards(jpeg_dataset, s3_env.root)
    cache, client = owner(_config(tmp_path), shards)

    client.announce([s.uri for s in shards[:2]])
    _wait_until(lambda: len(cache.cached_uris()) == 2)
    digests = _read_shards(client, [s.uri for s in shards[:2]])

    assert digests == _digests(jpeg_dataset)[:2]
    assert cache.stats.downloads == 2 and cache.stats.hits == 2


def test_a_pin_of_another_process_survives_the_owner_holding_the_file_open(
    s3_env: BucketEnv, six_shards: WrittenDataset, tmp_path: Path, owner: Callable
) -> None:
    # The owner releases a pin early when it sees its own reader holding the file open; that
    # says nothing about a reader in another process, which may not have opened it yet.
    upload_tree(six_shards.root, s3_env.root)
    first, second = _remote_shards(six_shards, s3_env.root)[:2]
    config = _config(tmp_path, cache_bytes=max(first.num_bytes, second.num_bytes))
    cache, client = owner(config, [first, second])
    cache_dir = tmp_path / "cache"
    name = local_name(first.uri)
    held = open(cache.fetch(first.uri), "rb")  # the owner's own reader
    cache.release(first.uri)
    other = f"{os.getpid() + 1}-0-feedface"  # a client of another process, before its open
    (cache_dir / "requests" / f"{name}.need.{other}").touch()
    _wait_until(lambda: (cache_dir / "acks" / f"{name}.{other}").exists())
    opened: list[Any] = []
    reader = threading.Thread(target=lambda: opened.append(client.open(second.uri)))

    try:
        reader.start()
        time.sleep(0.5)
        assert (cache_dir / "shards" / name).exists() and not opened  # still pinned for it
        (cache_dir / "requests" / f"{name}.done.{other}").touch()
        reader.join(timeout=20)
        assert opened and hashlib.sha256(opened[0].read()).hexdigest() == second.sha256
        assert cache.cached_uris() == [second.uri]
    finally:
        held.close()
        for f in opened:
            f.close()


def test_the_owner_opens_its_watch_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening the inotify watch once ran a subprocess (ctypes' find_library). On the scanner
    # thread, a DataLoader worker forked meanwhile inherited its pipe, and the scanner answered
    # nothing until that worker exited (the fork test above hung about one run in ten). The
    # watch now opens on the caller's thread, before the owner's threads start.
    callers: list[threading.Thread] = []
    original = DirectoryWatch.open

    def recording(directory: str) -> DirectoryWatch | None:
        callers.append(threading.current_thread())
        return original(directory)

    monkeypatch.setattr(DirectoryWatch, "open", staticmethod(recording))
    cache = ShardCache(_config(tmp_path))
    try:
        assert callers == [threading.current_thread()]
    finally:
        cache.close()


def test_the_client_pickles_as_its_directory_and_numbers(tmp_path: Path) -> None:
    client = CacheClient(str(tmp_path), wait_timeout_s=12.5, poll_interval_s=0.01)

    copy = pickle.loads(pickle.dumps(client))

    assert (
        repr(copy)
        == repr(client)
        == (f"CacheClient({str(tmp_path)!r}, wait_timeout_s=12.5, poll_interval_s=0.01)")
    )
    assert CacheClient.for_config(_config(tmp_path)).wait_timeout_s == 30.0


def test_request_ids_name_their_process() -> None:
    assert requester_pid("4242-7-0a1b2c3d") == 4242
    assert requester_pid("0123456789012345678") is None  # tf.data's ids
    assert requester_pid("fetch") is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cache_dir": ""}, "cache_dir"),
        ({"wait_timeout_s": 0}, "wait_timeout_s"),
        ({"poll_interval_s": -1}, "poll_interval_s"),
        ({"poll_interval_s": True}, "poll_interval_s"),
    ],
)
def test_the_client_rejects_bad_arguments(kwargs: dict, message: str, tmp_path: Path) -> None:
    arguments: dict[str, Any] = {"cache_dir": str(tmp_path), **kwargs}
    with pytest.raises(ValueError, match=message):
        CacheClient(arguments.pop("cache_dir"), **arguments)


def test_the_client_rejects_local_paths(tmp_path: Path) -> None:
    client = CacheClient(str(tmp_path))
    with pytest.raises(ValueError, match="s3:// or gs://"):
        client.open("/data/train-00000-of-00001.tfrecord")
    with pytest.raises(ValueError, match="s3:// or gs://"):
        client.announce(["s3://bucket/a.tfrecord", "relative/b.tfrecord"])


# -- helpers ---------------------------------------------------------------------------------


class _DiskSampler:
    """Samples the bytes of shard files in a cache directory (cached and being downloaded)
    every millisecond, on a thread."""

    def __init__(self, cache_dir: Path) -> None:
        self._dirs = [cache_dir / "shards", cache_dir / "tmp"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.largest = 0
        self.samples = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for directory in self._dirs:
                for entry in os.scandir(directory):
                    if entry.name.startswith("."):  # a marker's or metadata's temporary
                        continue
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:
                        continue
            self.largest = max(self.largest, total)
            self.samples += 1
            time.sleep(0.001)


def _wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)
