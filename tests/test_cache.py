"""The shard cache against real S3 (moto) and GCS (emulator) servers on loopback."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tensorflow as tf

from objstore import ObjectNotFoundError, RetryPolicy
from tests.fixtures.fault_proxy import FaultPlan
from tests.fixtures.object_store import BucketEnv, upload_tree
from tests.fixtures.shards import WrittenDataset
from tfrecord_io.cache import (
    CacheConfig,
    RemoteShard,
    ShardCache,
    ShardIntegrityError,
    open_cache,
)

_FAST_RETRY = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, max_backoff_s=0.05, timeout_s=10)


@pytest.fixture(params=["s3", "gcs"])
def bucket(request: pytest.FixtureRequest) -> BucketEnv:
    """A fresh bucket on each real server in turn."""
    return request.getfixturevalue("s3_env" if request.param == "s3" else "gcs_env")


@pytest.fixture()
def caches() -> Iterator[Callable[..., ShardCache]]:
    """``caches(config, shards)`` opens a cache that is closed after the test."""
    opened: list[ShardCache] = []

    def make(config: CacheConfig, shards: list[RemoteShard]) -> ShardCache:
        cache = open_cache(config, shards)
        opened.append(cache)
        return cache

    yield make
    for cache in opened:
        cache.close()


def _remote_shards(dataset: WrittenDataset, root: str, split: str = "train") -> list[RemoteShard]:
    return [
        RemoteShard(f"{root}/{s.file}", s.num_bytes, s.sha256)
        for s in dataset.manifest.split(split).shards
    ]


def _read_through(cache: ShardCache, uris: list[str], *, cycle_length: int = 2) -> list[bytes]:
    files = cache.read_ahead(tf.data.Dataset.from_tensor_slices(uris))
    records = files.interleave(
        cache.records,
        cycle_length=cycle_length,
        num_parallel_calls=cycle_length,
        deterministic=True,
    )
    return [r.numpy() for r in records]


def _read_local(paths: list[Path], *, cycle_length: int = 2) -> list[bytes]:
    files = tf.data.Dataset.from_tensor_slices([str(p) for p in paths])
    records = files.interleave(
        tf.data.TFRecordDataset, cycle_length=cycle_length, num_parallel_calls=cycle_length
    )
    return [r.numpy() for r in records]


def _config(tmp_path: Path, **overrides: object) -> CacheConfig:
    values: dict[str, object] = {
        "cache_dir": str(tmp_path / "cache"),
        "cache_bytes": 1 << 20,
        "retry": _FAST_RETRY,
        "poll_interval_s": 0.002,
    }
    values.update(overrides)
    return CacheConfig(**values)  # type: ignore[arg-type]


def test_streams_shards_identical_to_local_disk(
    bucket: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path, caches: Callable
) -> None:
    upload_tree(jpeg_dataset.root, bucket.root)
    shards = _remote_shards(jpeg_dataset, bucket.root)
    cache = caches(_config(tmp_path), shards)

    got = _read_through(cache, [s.uri for s in shards])

    assert got == _read_local(jpeg_dataset.shard_paths("train"))
    assert len(got) == jpeg_dataset.manifest.split("train").num_examples
    assert cache.stats.downloads == len(shards)
    assert cache.stats.failures == 0


def test_faults_do_not_change_the_output(
    bucket: BucketEnv,
    jpeg_dataset: WrittenDataset,
    tmp_path: Path,
    caches: Callable,
    fault_proxy: Callable,
) -> None:
    upload_tree(jpeg_dataset.root, bucket.root)
    shards = _remote_shards(jpeg_dataset, bucket.root)
    # Drawn faults land on whichever requests the threads send first, so a run may draw no
    # truncation of a body at all: the first try of every GET of one shard is cut for certain.
    plan = FaultPlan(
        seed=7,
        error_rate=0.2,
        reset_rate=0.15,
        truncate_rate=0.15,
        latency_s=0.02,
        fail_first="train-00001-",
    )
    proxy = fault_proxy(bucket.server_url, plan, flavour="s3" if bucket.scheme == "s3" else "gcs")
    bucket.point_at(proxy.url)
    # Small chunks: several ranged GETs per shard, each retried on its own.
    cache = caches(_config(tmp_path, chunk_bytes=4096), shards)

    got = _read_through(cache, [s.uri for s in shards])

    assert got == _read_local(jpeg_dataset.shard_paths("train"))
    assert proxy.stats.faults >= 5, proxy.stats
    # Bodies cut short (for certain), and 503s and resets drawn (about 9 of 26 requests).
    assert proxy.stats.truncations and proxy.stats.errors_503 + proxy.stats.resets >= 3
    # Bounded: no request was tried more often than the policy allows.
    assert max(proxy.stats.attempts_by_request.values()) <= _FAST_RETRY.max_attempts


def test_evicts_least_recently_used_within_cache_bytes(
    s3_env: BucketEnv, tmp_path: Path, caches: Callable
) -> None:
    from tests.fixtures.shards import write_dataset

    dataset = write_dataset(
        tmp_path / "ds", examples={"train": 24}, num_shards={"train": 6}, image_size=32
    )
    upload_tree(dataset.root, s3_env.root)
    shards = _remote_shards(dataset, s3_env.root)
    largest = max(s.num_bytes for s in shards)
    config = _config(tmp_path, cache_bytes=2 * largest + 10, download_ahead=1)
    cache = caches(config, shards)

    got = _read_through(cache, [s.uri for s in shards], cycle_length=1)

    assert got == _read_local(dataset.shard_paths("train"), cycle_length=1)
    assert cache.stats.evictions >= len(shards) - 2
    assert cache.used_bytes <= config.cache_bytes
    on_disk = sum(f.stat().st_size for f in (tmp_path / "cache" / "shards").iterdir())
    assert on_disk == cache.used_bytes
    # The shards still cached are the last ones read.
    assert set(cache.cached_uris()) <= {s.uri for s in shards[-3:]}


def test_a_cache_of_one_shard_still_progresses_under_a_wide_interleave(
    s3_env: BucketEnv, tmp_path: Path, caches: Callable
) -> None:
    from tests.fixtures.shards import write_dataset

    dataset = write_dataset(
        tmp_path / "ds", examples={"train": 24}, num_shards={"train": 6}, image_size=32
    )
    upload_tree(dataset.root, s3_env.root)
    shards = _remote_shards(dataset, s3_env.root)
    largest = max(s.num_bytes for s in shards)
    # Four shards open at once, more built ahead by the interleave, room for one.
    cache = caches(_config(tmp_path, cache_bytes=largest, download_ahead=2), shards)

    got = _read_through(cache, [s.uri for s in shards], cycle_length=4)

    assert got == _read_local(dataset.shard_paths("train"), cycle_length=4)
    assert cache.used_bytes <= largest


def test_downloads_ahead_in_read_order_and_bounded(
    s3_env: BucketEnv, tmp_path: Path, caches: Callable
) -> None:
    from tests.fixtures.shards import write_dataset

    dataset = write_dataset(
        tmp_path / "ds", examples={"train": 32}, num_shards={"train": 8}, image_size=32
    )
    upload_tree(dataset.root, s3_env.root)
    shards = _remote_shards(dataset, s3_env.root)
    cache = caches(_config(tmp_path, download_ahead=2), shards)
    order = [shards[i].uri for i in (5, 2, 7, 0, 1, 3, 4, 6)]
    files = cache.read_ahead(tf.data.Dataset.from_tensor_slices(order))
    records = files.interleave(cache.records, cycle_length=1)

    next(iter(records))  # the first shard is open; the next ones are announced
    _wait_until(lambda: len(cache.cached_uris()) >= 3)
    cached = set(cache.cached_uris())

    assert {order[0], order[1], order[2]} <= cached
    # At most the open shard, the prefetch buffer and the element being mapped.
    assert len(cached) <= 1 + 2 + 1
    assert order[-1] not in cached


def _wait_until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def test_cache_smaller_than_largest_shard_is_refused(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path
) -> None:
    shards = _remote_shards(jpeg_dataset, s3_env.root)
    largest = max(shards, key=lambda s: s.num_bytes)

    with pytest.raises(ValueError, match="smaller than the largest shard") as info:
        ShardCache(_config(tmp_path, cache_bytes=largest.num_bytes - 1), shards)

    assert largest.uri in str(info.value)
    assert str(largest.num_bytes) in str(info.value)


def test_sha256_mismatch_names_the_shard_and_removes_the_file(
    bucket: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path, caches: Callable
) -> None:
    upload_tree(jpeg_dataset.root, bucket.root)
    shards = _remote_shards(jpeg_dataset, bucket.root)
    bad = dataclasses.replace(shards[1], sha256="0" * 64)
    cache = caches(_config(tmp_path), [shards[0], bad])

    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        _read_through(cache, [shards[0].uri, bad.uri])
    with pytest.raises(ShardIntegrityError, match="SHA-256 mismatch") as direct:
        cache.fetch(bad.uri)

    assert bad.uri in str(info.value) and "SHA-256 mismatch" in str(info.value)
    assert direct.value.uri == bad.uri
    assert bad.uri not in cache.cached_uris()
    leftovers = list((tmp_path / "cache" / "shards").iterdir()) + list(
        (tmp_path / "cache" / "tmp").iterdir()
    )
    assert all(bad.uri.rsplit("/", 1)[1] not in p.name for p in leftovers)


def test_missing_object_fails_fast_naming_the_uri(
    bucket: BucketEnv, tmp_path: Path, caches: Callable, fault_proxy: Callable
) -> None:
    proxy = fault_proxy(
        bucket.server_url, FaultPlan(), flavour="s3" if bucket.scheme == "s3" else "gcs"
    )
    bucket.point_at(proxy.url)
    missing = RemoteShard(bucket.uri("nope", "train-00000-of-00001.tfrecord"), 100, "a" * 64)
    cache = caches(_config(tmp_path), [missing])

    with pytest.raises(tf.errors.InvalidArgumentError, match="object not found") as info:
        _read_through(cache, [missing.uri])
    with pytest.raises(ObjectNotFoundError):
        cache.fetch(missing.uri)

    assert missing.uri in str(info.value)
    object_requests = [n for k, n in proxy.stats.attempts_by_request.items() if "nope" in k]
    assert object_requests == [1]  # asked once (HEAD), not retried


def test_reuses_verified_files_of_an_earlier_run(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path
) -> None:
    upload_tree(jpeg_dataset.root, s3_env.root)
    shards = _remote_shards(jpeg_dataset, s3_env.root)
    first = open_cache(_config(tmp_path), shards)
    try:
        for shard in shards:
            first.fetch(shard.uri)
    finally:
        first.close()
    (tmp_path / "cache" / "shards" / "stray-partial.tfrecord").write_bytes(b"junk")

    second = open_cache(_config(tmp_path), shards)
    try:
        paths = [second.fetch(s.uri) for s in shards]
        assert second.stats.downloads == 0 and second.stats.hits == len(shards)
        assert [Path(p).read_bytes() for p in paths] == [
            p.read_bytes() for p in jpeg_dataset.shard_paths("train")
        ]
        assert not (tmp_path / "cache" / "shards" / "stray-partial.tfrecord").exists()
    finally:
        second.close()


def test_one_owner_per_cache_dir(tmp_path: Path, caches: Callable) -> None:
    caches(_config(tmp_path), [])

    # flock locks belong to an open file, so a second owner is refused even in this process.
    with pytest.raises(RuntimeError, match="in use by another process"):
        ShardCache(_config(tmp_path))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"cache_bytes": 0}, "cache_bytes"),
        ({"download_threads": 0}, "download_threads"),
        ({"cache_dir": "s3://bucket/cache"}, "local path"),
        ({"cache_dir": "/tmp/cache[1]"}, "glob"),
        ({"pin_s": 0}, "pin_s"),
    ],
)
def test_config_rejects_bad_values(overrides: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **overrides)


def test_remote_shard_rejects_local_paths() -> None:
    with pytest.raises(ValueError, match="s3:// or gs://"):
        RemoteShard("/data/train-00000-of-00001.tfrecord", 10)


def test_checkpoint_resumes_exactly_with_an_emptied_cache(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path
) -> None:
    upload_tree(jpeg_dataset.root, s3_env.root)
    shards = _remote_shards(jpeg_dataset, s3_env.root)
    config = _config(tmp_path)

    def batches(cache: ShardCache) -> tf.data.Dataset:
        files = tf.data.Dataset.from_tensor_slices([s.uri for s in shards]).shuffle(8, seed=3)
        records = cache.read_ahead(files).interleave(
            cache.records, cycle_length=2, num_parallel_calls=2, deterministic=True
        )
        return records.batch(5)

    cache = open_cache(config, shards)
    try:
        expected = [b.numpy().tolist() for b in batches(cache)]
        it = iter(batches(cache))
        head = [next(it).numpy().tolist() for _ in range(2)]
        prefix = tf.train.Checkpoint(iterator=it).write(str(tmp_path / "ckpt" / "it"))
    finally:
        cache.close()
    # A new host: nothing cached. The restored readers must get their shards back.
    shutil.rmtree(tmp_path / "cache")

    cache = open_cache(config, shards)
    try:
        it = iter(batches(cache))
        tf.train.Checkpoint(iterator=it).read(prefix).assert_consumed()
        rest = [b.numpy().tolist() for b in it]
        assert cache.stats.downloads > 0
    finally:
        cache.close()

    assert head + rest == expected


def test_make_dataset_streams_a_bucket_through_a_given_cache(
    s3_env: BucketEnv, jpeg_dataset: WrittenDataset, tmp_path: Path
) -> None:
    from tfrecord_io import ReadConfig, make_dataset

    upload_tree(jpeg_dataset.root, s3_env.root)
    config = _config(tmp_path)

    def keys(source: str, **kwargs: object) -> list[bytes]:
        batches = make_dataset(
            source,
            "train",
            global_batch_size=5,
            training=False,
            read_config=ReadConfig(with_keys=True),
            **kwargs,
        )
        return sorted(k for _, _, ks in batches.as_numpy_iterator() for k in ks)

    try:
        streamed = keys(s3_env.root, shard_cache=config)
        cache = open_cache(config)
        assert cache.stats.downloads == len(jpeg_dataset.manifest.split("train").shards)
        assert (tmp_path / "cache" / "shards").is_dir()
    finally:
        open_cache(config).close()

    assert streamed == keys(str(jpeg_dataset.root))
