"""read_examples: examples by key from a byte range of their shard, local, on S3 and on GCS."""

from __future__ import annotations

import shutil
from urllib.parse import unquote

import pytest
import tensorflow as tf

from catalog.table import read_table
from schemas import record_from_example
from schemas.framing import FrameError
from tests.fixtures.fault_proxy import FaultPlan
from tests.fixtures.object_store import upload_tree
from tests.fixtures.pipeline_datasets import build_pipeline_dataset
from tfrecord_io.random_access import load_catalog, read_examples
from tfrecord_io.source import load_manifest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return build_pipeline_dataset(tmp_path_factory.mktemp("random-access"))


def _all_records(dataset) -> dict[str, tuple[str, int, bytes]]:
    """key -> (shard, position, serialized), read front to back by TensorFlow."""
    manifest = load_manifest(dataset)
    found = {}
    for shard in manifest.all_shards():
        for position, data in enumerate(tf.data.TFRecordDataset(str(dataset / shard.file))):
            serialized = bytes(data.numpy())
            found[record_from_example(serialized).sha256] = (shard.file, position, serialized)
    return found


def test_examples_by_key_in_the_order_asked(dataset):
    records = _all_records(dataset)
    keys = sorted(records)[::3][::-1]  # some of each split, out of catalog order
    examples = read_examples(str(dataset), keys)
    assert [e.location.key for e in examples] == keys
    for example in examples:
        shard, position, serialized = records[example.location.key]
        assert example.serialized == serialized
        assert (example.location.shard, example.location.record) == (shard, position)
    train = read_table(str(dataset / "catalog-train.parquet"))
    first = train.column("key")[0].as_py()
    (only,) = read_examples(dataset / "dataset.json", [first], splits=["train"])
    assert only.location.index == 0 and only.location.split == "train"


def test_unknown_keys_are_named(dataset):
    with pytest.raises(KeyError, match="no example with key " + "f" * 64):
        read_examples(str(dataset), ["f" * 64])


def test_damaged_catalog_and_shard_are_reported_naming_the_file(dataset, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    key = read_table(str(copy / "catalog-train.parquet")).column("key")[0].as_py()
    shard = read_table(str(copy / "catalog-train.parquet")).column("shard")[0].as_py()
    data = bytearray((copy / shard).read_bytes())
    data[30] ^= 0xFF  # inside the first record's payload
    (copy / shard).write_bytes(bytes(data))
    with pytest.raises(FrameError, match=f"{shard} at byte 0: data CRC mismatch"):
        read_examples(str(copy), [key])
    catalog = copy / "catalog-validation.parquet"
    catalog.write_bytes(catalog.read_bytes()[:-10] + b"x" * 10)
    with pytest.raises(ValueError, match="catalog .*catalog-validation.parquet is damaged"):
        load_catalog(str(copy), "validation")
    catalog.unlink()
    with pytest.raises(FileNotFoundError, match="catalog-validation.parquet is missing"):
        load_catalog(str(copy), "validation")


@pytest.mark.parametrize("env_name", ["s3_env", "gcs_env"])
def test_ranged_reads_on_object_stores(dataset, env_name, request, fault_proxy):
    env = request.getfixturevalue(env_name)
    root = f"{env.scheme}://{env.bucket}/data"
    upload_tree(dataset, root)
    records = _all_records(dataset)
    keys = sorted(records)[:4]
    # Every request goes through a loopback proxy (no faults) that counts them.
    proxy = fault_proxy(
        env.server_url, FaultPlan(seed=0), flavour="s3" if env.scheme == "s3" else "gcs"
    )
    env.point_at(proxy.url)
    examples = read_examples(root, keys)
    assert [e.serialized for e in examples] == [records[k][2] for k in keys]
    # The shards were touched only by one ranged GET per example, each for its frame exactly.
    shard_requests = sorted(r for r in proxy.stats.attempts_by_request if ".tfrecord" in r)
    expected = sorted(
        f"{e.location.shard} bytes={e.location.offset}-{e.location.offset + e.location.length - 1}"
        for e in examples
    )
    assert [r.split(" ", 1)[0] for r in shard_requests] == ["GET"] * len(keys), shard_requests
    names = [unquote(r).rsplit("/", 1)[-1].replace("?alt=media", "") for r in shard_requests]
    assert names == expected
