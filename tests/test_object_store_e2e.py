"""End to end on real local object stores: the pipeline from a bucket to a bucket, then the reader
and verify from the bucket, all through a fault-injecting proxy, compared with a clean local run;
permanent errors fail fast; planted credentials never show up anywhere."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from beam_pipelines import images_to_tfrecord
from dataset_tools.verify import __main__ as verify
from objstore import get_store
from schemas import MANIFEST_NAME, REJECTED_NAME, Manifest, ShardInfo
from schemas.shard_table import decode_manifest
from tests.fixtures.fault_proxy import FaultPlan
from tests.fixtures.images import make_image_tree
from tests.fixtures.object_store import (
    PLANTED_ACCESS_KEY_ID,
    PLANTED_SECRET,
    AdcCredentials,
    BucketEnv,
    Server,
    moto_auth,
    upload_tree,
)
from tests.fixtures.shards import WrittenDataset
from tfrecord_io import CorruptionCounter, ReadConfig, make_dataset
from tfrecord_io.source import load_manifest, resolve_source

_PIPELINE_FLAGS = ["--num_shards", "2", "--image_size", "24", "--max_bad_fraction", "0.5"]
# Random faults on every request, and a certain fault on the first try of every image request
# (GETs cut short in transit), so the pipeline's reads are sure to meet one. Each fault costs
# the client's retry back-off (about a second), during which the test waits: at 16 % of
# requests the pipeline, reader and verify met 34-35 faults a run, at 8 % 19-20.
_FAULTS = FaultPlan(
    seed=11,
    error_rate=0.04,
    reset_rate=0.02,
    truncate_rate=0.02,
    latency_s=0.003,
    fail_first="images",
)


def _image_reads_were_cut(log: list[tuple[str, str]]) -> bool:
    return any(a == "truncate" and k.startswith("GET") and "images" in k for a, k in log)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """5 small JPEGs in 3 classes (one name with a space, one non-ASCII) and one bad file."""
    root = tmp_path_factory.mktemp("e2e") / "images"
    make_image_tree(root, {"cat": 2, "dög": 2, "red fox": 1}, size=(40, 32))
    (root / "cat" / "broken.jpg").write_bytes(b"<html>not an image</html>")
    return root


@pytest.fixture(scope="module")
def reference(images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same images through the pipeline on local disk: the clean run to match."""
    output = tmp_path_factory.mktemp("e2e") / "reference"
    assert (
        images_to_tfrecord.main(["--input", str(images), "--output", str(output), *_PIPELINE_FLAGS])
        == 0
    )
    return output


def _examples(source: str) -> list[tuple[bytes, int, bytes]]:
    dataset = make_dataset(
        source,
        "train",
        global_batch_size=2,
        training=False,
        image_size=24,
        read_config=ReadConfig(with_keys=True),
    )
    out = [
        (key, int(label), image.tobytes())
        for images, labels, keys in dataset.as_numpy_iterator()
        for image, label, key in zip(images, labels, keys, strict=True)
    ]
    return sorted(out)


def _assert_same_dataset(manifest: Manifest, reference: Manifest) -> None:
    # Shard sizes and hashes differ only because each record names its source URI.
    assert manifest.label_names == reference.label_names
    assert manifest.counts == reference.counts
    assert manifest.image == reference.image
    for name, split in reference.splits.items():
        got = manifest.split(name)
        assert [(s.file, s.num_examples) for s in got.shards] == [
            (s.file, s.num_examples) for s in split.shards
        ]
    ignore = {"input"}
    assert {k: v for k, v in manifest.options.items() if k not in ignore} == {
        k: v for k, v in reference.options.items() if k not in ignore
    }


def _records(data: bytes, tmp_path: Path, source_root: str) -> list[dict]:
    """Every record of a shard as a feature dict, with its source URI made relative."""
    import tensorflow as tf

    path = tmp_path / "shard.tfrecord"
    path.write_bytes(data)
    out = []
    for serialized in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
        example = tf.train.Example.FromString(serialized)
        features = {k: v for k, v in example.features.feature.items()}
        filename = features.pop("image/filename").bytes_list.value[0].decode()
        assert filename.startswith(source_root), (filename, source_root)
        out.append({"relative_source": filename[len(source_root) :], **features})
    return out


def _rejections(text: str) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in text.splitlines() if line]
    return sorted((row["uri"].rsplit("/", 2)[-2:][1], row["reason"]) for row in rows)


def _pipeline_bucket_to_bucket(
    bucket: BucketEnv,
    images: Path,
    reference: Path,
    proxy_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> str:
    """Runs pipeline, reader and verify against ``bucket`` through ``proxy_url``; checks each
    against the clean local run. Returns everything they printed and logged."""
    clean = get_store(bucket.root)
    upload_tree(images, bucket.uri("images"))
    monkeypatch.setenv("TFRECORD_IO_CACHE_DIR", str(tmp_path / "cache"))
    bucket.point_at(proxy_url)
    output = bucket.uri("datasets", "pets")

    with caplog.at_level(logging.INFO):
        code = images_to_tfrecord.main(
            ["--input", bucket.uri("images"), "--output", output, *_PIPELINE_FLAGS]
        )
        printed = [capsys.readouterr()]
        assert code == 0, printed[0].err[-3000:]

        # The commit point and the reports are identical to the clean local run's.
        manifest_text = clean.read_bytes(f"{output}/{MANIFEST_NAME}").decode()
        expected = load_manifest(reference)
        read = lambda name: clean.read_bytes(f"{output}/{name}")  # noqa: E731
        _assert_same_dataset(decode_manifest(manifest_text, read), expected)
        rejected_text = clean.read_bytes(f"{output}/{REJECTED_NAME}").decode()
        assert _rejections(rejected_text) == _rejections((reference / REJECTED_NAME).read_text())
        for shard in expected.all_shards():
            # Record for record the same bytes, except that the source URI is the bucket's.
            got = _records(
                clean.read_bytes(f"{output}/{shard.file}"), tmp_path, bucket.uri("images")
            )
            want = _records((reference / shard.file).read_bytes(), tmp_path, str(images))
            assert got == want
        # No temporary, staged or probe objects are left behind.
        names = sorted(info.uri.rsplit("/", 1)[1] for info in clean.list(output + "/"))
        # The same files as the clean local run: shards, index files, catalogs, reports.
        assert names == sorted(p.name for p in reference.iterdir() if not p.name.startswith("."))

        # The reader streams the bucket through the shard cache: the same examples as local.
        assert _examples(output) == _examples(str(reference))
        # verify checks every shard in the bucket.
        assert verify.main([output, "--json", "--no-progress"]) == 0
        printed.append(capsys.readouterr())
        report = json.loads(printed[-1].out)
        assert report["ok"] and report["num_failed_shards"] == 0
    resolve_source(output, "train").shard_cache().close()
    outputs = [p.out + p.err for p in printed]
    return "\n".join([*outputs, caplog.text, manifest_text, rejected_text])


@pytest.mark.slow
def test_s3_bucket_to_bucket_under_faults_matches_a_clean_run(
    s3_env: BucketEnv,
    moto_server: Server,
    images: Path,
    reference: Path,
    fault_proxy: Callable,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = fault_proxy(moto_server.url, _FAULTS, flavour="s3")

    everything = _pipeline_bucket_to_bucket(
        s3_env, images, reference, proxy.url, tmp_path, monkeypatch, capsys, caplog
    )

    assert proxy.stats.faults >= 5, proxy.stats
    assert _image_reads_were_cut(proxy.stats.fault_log)
    assert PLANTED_SECRET not in everything
    assert PLANTED_ACCESS_KEY_ID not in everything


@pytest.mark.slow
def test_gcs_bucket_to_bucket_under_faults_matches_a_clean_run(
    gcs_env: BucketEnv,
    gcs_emulator: Server,
    gcs_adc: AdcCredentials,
    images: Path,
    reference: Path,
    fault_proxy: Callable,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = fault_proxy(gcs_emulator.url, _FAULTS, flavour="gcs")

    everything = _pipeline_bucket_to_bucket(
        gcs_env, images, reference, proxy.url, tmp_path, monkeypatch, capsys, caplog
    )

    assert proxy.stats.faults >= 5, proxy.stats
    assert _image_reads_were_cut(proxy.stats.fault_log)
    for secret in gcs_adc.secrets:
        assert secret not in everything


@pytest.mark.parametrize("scheme", ["s3", "gcs"])
def test_pipeline_reads_retry_bodies_cut_short_but_not_missing_objects(
    scheme: str, request: pytest.FixtureRequest, fault_proxy: Callable
) -> None:
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipelines.graph.transforms import read_source
    from beam_pipelines.image.prepare import RejectedImage

    bucket: BucketEnv = request.getfixturevalue("s3_env" if scheme == "s3" else "gcs_env")
    if scheme == "gcs":
        request.getfixturevalue("gcs_adc")
    payload = bytes(range(256)) * 64
    get_store(bucket.root).write_bytes(bucket.uri("images", "a.jpg"), payload)
    plan = FaultPlan(fail_first="images")
    proxy = fault_proxy(bucket.server_url, plan, flavour="s3" if scheme == "s3" else "gcs")
    bucket.point_at(proxy.url)
    FileSystems.set_options(PipelineOptions([]))

    assert read_source(bucket.uri("images", "a.jpg")) == payload
    with pytest.raises(RejectedImage) as info:
        read_source(bucket.uri("images", "missing.jpg"))

    assert (
        info.value.reason == "unreadable"
        and bucket.uri("images", "missing.jpg") in info.value.detail
    )
    assert _image_reads_were_cut(proxy.stats.fault_log)
    missing = [n for k, n in proxy.stats.attempts_by_request.items() if "missing" in k]
    assert missing and max(missing) <= 2  # the certain first-try fault, then the 404: no retries


def test_missing_output_bucket_fails_fast_with_s3_flags_and_publishes_nothing(
    s3_env: BucketEnv,
    images: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    upload_tree(images, s3_env.uri("images"))
    # Beam's --s3_* flags instead of the environment; the secret is planted in the flags.
    endpoint = s3_env.server_url
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    missing = "s3://no-such-bucket-e2e/out"

    with caplog.at_level(logging.INFO):
        code = images_to_tfrecord.main(
            [
                "--input",
                s3_env.uri("images"),
                "--output",
                missing,
                f"--s3_endpoint_url={endpoint}",
                f"--s3_access_key_id={PLANTED_ACCESS_KEY_ID}",
                f"--s3_secret_access_key={PLANTED_SECRET}",
                "--s3_region_name=us-east-1",
                *_PIPELINE_FLAGS,
            ]
        )

    printed = capsys.readouterr()
    assert code == 2
    assert f"--output {missing} is not writable" in printed.err
    assert PLANTED_SECRET not in printed.out + printed.err + caplog.text
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", PLANTED_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", PLANTED_SECRET)
    assert [i.uri for i in get_store(s3_env.root).list(s3_env.root + "/")] == sorted(
        get_store(s3_env.root).glob(s3_env.uri("images", "*", "*"))
    )


def test_access_denied_input_fails_fast_naming_it(
    s3_env: BucketEnv,
    moto_server: Server,
    images: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    upload_tree(images, s3_env.uri("images"))
    output = s3_env.uri("out")

    with caplog.at_level(logging.INFO), moto_auth(moto_server):
        code = images_to_tfrecord.main(
            ["--input", s3_env.uri("images"), "--output", output, *_PIPELINE_FLAGS]
        )

    printed = capsys.readouterr()
    assert code == 3  # the job's own failure, not a bad-fraction refusal
    assert s3_env.uri("images") in printed.err and "403" in printed.err
    assert PLANTED_SECRET not in printed.out + printed.err + caplog.text
    assert not get_store(s3_env.root).exists(f"{output}/{MANIFEST_NAME}")


def test_gcs_missing_output_bucket_fails_fast(
    gcs_env: BucketEnv, gcs_adc: AdcCredentials, images: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upload_tree(images, gcs_env.uri("images"))
    missing = "gs://no-such-bucket-e2e/out"

    code = images_to_tfrecord.main(
        ["--input", gcs_env.uri("images"), "--output", missing, *_PIPELINE_FLAGS]
    )

    assert code == 2 and f"--output {missing} is not writable" in capsys.readouterr().err


def test_reader_and_verify_on_a_tampered_bucket_name_the_shard(
    s3_env: BucketEnv,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import tensorflow as tf

    from tests.fixtures.shards import write_dataset

    dataset = write_dataset(tmp_path / "ds", examples={"train": 12}, num_shards={"train": 3})
    upload_tree(dataset.root, s3_env.uri("ds"))
    bad = dataset.manifest.split("train").shards[1]
    data = bytearray((dataset.root / bad.file).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    get_store(s3_env.root).write_bytes(s3_env.uri("ds", bad.file), bytes(data))
    monkeypatch.setenv("TFRECORD_IO_CACHE_DIR", str(tmp_path / "cache"))
    source = s3_env.uri("ds")

    def keys(counter: CorruptionCounter | None = None) -> list[bytes]:
        batches = make_dataset(
            source,
            "train",
            global_batch_size=4,
            training=False,
            read_config=ReadConfig(with_keys=True, skip_corrupt=counter is not None),
            corruption_counter=counter,
        )
        return sorted(k for _, _, ks in batches.as_numpy_iterator() for k in ks)

    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        keys()
    counter = CorruptionCounter()
    kept = keys(counter)
    code = verify.main([source, "--json", "--no-progress"])
    resolve_source(source, "train").shard_cache().close()

    assert s3_env.uri("ds", bad.file) in str(info.value) and "SHA-256 mismatch" in str(info.value)
    in_bad = _keys_of(dataset, bad)
    good = {r.sha256.encode() for r in dataset.records["train"] if r.sha256 not in in_bad}
    assert set(kept) == good and len(kept) == 12 - bad.num_examples
    assert counter.as_dict()["damaged_shards"] == 1
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and [s["file"] for s in report["shards"] if not s["ok"]] == [bad.file]


def _keys_of(dataset: WrittenDataset, shard: ShardInfo) -> set[str]:
    """Keys stored in one shard (records are listed shard by shard, in shard order)."""
    start = 0
    for info in dataset.manifest.split("train").shards:
        if info.file == shard.file:
            return {r.sha256 for r in dataset.records["train"][start : start + info.num_examples]}
        start += info.num_examples
    raise AssertionError(shard.file)
