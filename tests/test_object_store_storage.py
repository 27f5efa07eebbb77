"""The object-store layer against real S3 (moto) and GCS (emulator) servers: round trips,
bounded retries under injected faults, fail-fast permanent errors, and credential redaction."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable

import pytest

from objstore import (
    ObjectAccessError,
    ObjectNotFoundError,
    ObjectStoreError,
    RetryPolicy,
    get_store,
    install_log_redaction,
    parse_uri,
    redact,
    register_secret,
)
from tests.fixtures.fault_proxy import FaultPlan
from tests.fixtures.object_store import (
    PLANTED_ACCESS_KEY_ID,
    PLANTED_SECRET,
    BucketEnv,
    Server,
    moto_auth,
)

_FAST = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.04, timeout_s=10)


@pytest.fixture(params=["s3", "gcs"])
def bucket(request: pytest.FixtureRequest) -> BucketEnv:
    """A fresh bucket on each real server in turn."""
    return request.getfixturevalue("s3_env" if request.param == "s3" else "gcs_env")


def _flavour(bucket: BucketEnv) -> str:
    return "s3" if bucket.scheme == "s3" else "gcs"


def test_round_trip_list_glob_and_delete(bucket: BucketEnv) -> None:
    store = get_store(bucket.root, _FAST)
    payload = os.urandom(70_000)
    for name in ("a/x-1.bin", "a/x-2.bin", "a/sub/y.bin", "b/z.bin"):
        store.write_bytes(bucket.uri(name), payload)

    assert store.read_bytes(bucket.uri("a/x-1.bin")) == payload
    assert store.read_range(bucket.uri("a/x-2.bin"), 10, 1010) == payload[10:1010]
    assert store.size(bucket.uri("b/z.bin")) == len(payload)
    assert [i.uri for i in store.list(bucket.uri("a/"))] == [
        bucket.uri("a/sub/y.bin"),
        bucket.uri("a/x-1.bin"),
        bucket.uri("a/x-2.bin"),
    ]
    assert store.glob(bucket.uri("a/x-*.bin")) == [bucket.uri("a/x-1.bin"), bucket.uri("a/x-2.bin")]
    assert store.isdir(bucket.uri("a")) and not store.isdir(bucket.uri("c"))
    store.delete(bucket.uri("b/z.bin"))
    store.delete(bucket.uri("b/z.bin"))  # deleting a missing object is fine
    assert not store.exists(bucket.uri("b/z.bin"))


def test_one_level_listing_upload_and_digest(bucket: BucketEnv, tmp_path: os.PathLike[str]) -> None:
    store = get_store(bucket.root, _FAST)
    for name in ("d/a.bin", "d/b.bin", "d/cat/x.bin", "d/cat/deep/y.bin", "d/dog/z.bin", "e/w"):
        store.write_bytes(bucket.uri(name), name.encode())
    store.write_bytes(bucket.uri("d/"), b"")  # a "directory marker" object: not a file
    local = os.path.join(tmp_path, "big.bin")
    payload = os.urandom(300_000)
    with open(local, "wb") as f:
        f.write(payload)

    dirs, files = store.list_one_level(bucket.uri("d"))

    assert dirs == [bucket.uri("d", "cat"), bucket.uri("d", "dog")]
    assert [(f.uri, f.size) for f in files] == [
        (bucket.uri("d/a.bin"), 7),
        (bucket.uri("d/b.bin"), 7),
    ]
    assert all(f.mtime and abs(f.mtime - time.time()) < 600 for f in files)
    assert store.list_one_level(bucket.uri("d") + "/") == (dirs, files)  # a trailing / is the same
    assert store.list_one_level(bucket.root)[0] == [bucket.uri("d"), bucket.uri("e")]
    assert store.list_one_level(bucket.uri("nothing")) == ([], [])
    store.upload(bucket.uri("d", "up.bin"), local)
    assert store.read_bytes(bucket.uri("d", "up.bin")) == payload
    assert store.digest(bucket.uri("d", "up.bin"), chunk_bytes=65_536) == (
        len(payload),
        hashlib.sha256(payload).hexdigest(),
    )
    with pytest.raises(ObjectNotFoundError, match="nobucket-x2"):
        store.list_one_level(f"{bucket.scheme}://nobucket-x2/d")
    with pytest.raises(ObjectNotFoundError, match="object not found"):
        store.digest(bucket.uri("d", "missing.bin"))


def test_faults_are_retried_and_output_is_identical(
    bucket: BucketEnv, fault_proxy: Callable, tmp_path: os.PathLike[str]
) -> None:
    clean = get_store(bucket.root, _FAST)
    blobs = {f"f/{i}.bin": os.urandom(20_000 + i) for i in range(6)}
    for name, data in blobs.items():
        clean.write_bytes(bucket.uri(name), data)
    plan = FaultPlan(seed=3, error_rate=0.25, reset_rate=0.15, truncate_rate=0.15, latency_s=0.01)
    proxy = fault_proxy(bucket.server_url, plan, flavour=_flavour(bucket))
    bucket.point_at(proxy.url)
    faulty = get_store(bucket.root, _FAST)

    got = {}
    for name in blobs:
        dest = os.path.join(tmp_path, name.replace("/", "_"))
        faulty.download(bucket.uri(name), dest, chunk_bytes=4096)
        with open(dest, "rb") as f:
            got[name] = f.read()

    assert got == blobs
    assert proxy.stats.faults >= 10 and proxy.stats.forwarded > 0
    assert max(proxy.stats.attempts_by_request.values()) <= _FAST.max_attempts


def test_retries_are_bounded_and_name_the_uri(
    bucket: BucketEnv, fault_proxy: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    get_store(bucket.root, _FAST).write_bytes(bucket.uri("k.bin"), b"data")
    proxy = fault_proxy(bucket.server_url, FaultPlan(always_fail=True), flavour=_flavour(bucket))
    bucket.point_at(proxy.url)
    store = get_store(bucket.root, _FAST)

    with caplog.at_level(logging.WARNING, logger="objstore.retry"):
        with pytest.raises(ObjectStoreError) as info:
            store.read_bytes(bucket.uri("k.bin"))

    assert info.value.transient and info.value.attempts == _FAST.max_attempts
    assert bucket.uri("k.bin") in str(info.value) and "after 4 attempts" in str(info.value)
    assert list(proxy.stats.attempts_by_request.values()) == [_FAST.max_attempts]
    retries = [r for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == _FAST.max_attempts - 1


@pytest.mark.parametrize("missing", ["object", "bucket"])
def test_missing_object_or_bucket_fails_fast(
    bucket: BucketEnv, fault_proxy: Callable, missing: str
) -> None:
    proxy = fault_proxy(bucket.server_url, FaultPlan(), flavour=_flavour(bucket))
    bucket.point_at(proxy.url)
    store = get_store(bucket.root, _FAST)
    uri = bucket.uri("no/such.bin") if missing == "object" else f"{bucket.scheme}://nobucket-x1/k"

    with pytest.raises(ObjectNotFoundError) as info:
        store.read_bytes(uri)

    assert uri in str(info.value)
    expected = "object not found" if missing == "object" else "bucket 'nobucket-x1' does not exist"
    assert expected in str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    read_requests = [
        n for k, n in proxy.stats.attempts_by_request.items() if "/k" in k or "such" in k
    ]
    assert read_requests and all(n == 1 for n in read_requests)


def test_access_denied_fails_fast_and_never_shows_the_secret(
    s3_env: BucketEnv,
    moto_server: Server,
    fault_proxy: Callable,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    get_store(s3_env.root, _FAST).write_bytes(s3_env.uri("k.bin"), b"data")
    proxy = fault_proxy(moto_server.url, FaultPlan(), flavour="s3")
    s3_env.point_at(proxy.url)
    store = get_store(s3_env.root, _FAST)
    logging.getLogger("botocore").setLevel(logging.DEBUG)

    with caplog.at_level(logging.DEBUG), moto_auth(moto_server):
        # moto now checks signatures: the planted key is unknown to its IAM, a real 403.
        with pytest.raises(ObjectAccessError) as info:
            store.read_bytes(s3_env.uri("k.bin"))
    logging.getLogger("botocore").setLevel(logging.WARNING)

    message = str(info.value)
    assert s3_env.uri("k.bin") in message and "access denied" in message
    assert isinstance(info.value, PermissionError)
    assert list(proxy.stats.attempts_by_request.values()) == [1]
    captured = capsys.readouterr()
    everything = "\n".join(
        [message, repr(info.value), caplog.text, captured.out, captured.err]
        + [r.getMessage() for r in caplog.records]
    )
    assert any("botocore" in r.name for r in caplog.records)  # debug logs were on
    assert PLANTED_SECRET not in everything
    assert PLANTED_ACCESS_KEY_ID not in everything


def test_redact_hides_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", PLANTED_SECRET)
    register_secret("flag-secret-value-123")
    text = (
        f"key {PLANTED_SECRET} --s3_secret_access_key flag-secret-value-123 "
        "--s3_session_token=tok123456789 aws_secret_access_key = other-secret-1 "
        "s3://user:pa55word@bucket/key https://h/x?X-Amz-Signature=abcdef0123456789&a=1 "
        '{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIE\\n-----END PRIVATE KEY-----"} '
        "Authorization: AWS4-HMAC-SHA256 Credential=AKIA/20260101/us-east-1/s3/aws4_request"
    )

    out = redact(text)

    for secret in (
        PLANTED_SECRET,
        "flag-secret-value-123",
        "tok123456789",
        "other-secret-1",
        "pa55word",
        "abcdef0123456789",
        "MIIE",
        "AKIA/2026",
    ):
        assert secret not in out, secret
    assert "s3://***@bucket/key" in out and "key ***" in out


def test_log_records_are_redacted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", PLANTED_SECRET)
    install_log_redaction()
    log = logging.getLogger("some.library")

    with caplog.at_level(logging.INFO):
        log.info("connecting with secret %s", PLANTED_SECRET)
        try:
            raise ValueError(f"bad secret {PLANTED_SECRET}")
        except ValueError:
            log.exception("failed")

    assert PLANTED_SECRET not in caplog.text
    assert "connecting with secret ***" in caplog.text and "bad secret ***" in caplog.text


@pytest.mark.parametrize(
    "uri, message",
    [
        ("/local/path", "s3:// or gs://"),
        ("hdfs://x/y", "s3:// or gs://"),
        ("s3:///key", "no bucket"),
    ],
)
def test_parse_uri_rejects_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_uri(uri)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"initial_backoff_s": -1}, "initial_backoff_s"),
        ({"initial_backoff_s": 2, "max_backoff_s": 1}, "max_backoff_s"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_retry_policy_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.5, multiplier=2)
    assert [policy.backoff_cap(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_which_uris_tensorflow_reads_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfrecord_io.source import reads_natively

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert reads_natively("/data/ds") and reads_natively("file:///data/ds")
    assert not reads_natively("s3://bucket/ds")
    assert reads_natively("gs://bucket/ds")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    assert not reads_natively("gs://bucket/ds")


def test_a_listing_in_a_bucket_is_cut_and_read_in_ranges(bucket: BucketEnv) -> None:
    # Beam's FileSystems on the bucket (the scan streams the object; each range is one ranged
    # GET), with the options a launcher gives them: none, so the standard environment.
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipelines.inputs.listing_ranges import estimate_records, listing_ranges
    from beam_pipelines.inputs.listings import listing_sources

    FileSystems.set_options(PipelineOptions([]))

    rows = [f'"img {i}.jpg","class, {i % 3}"' for i in range(40)]
    rows[7] = '"img\n7.jpg",cat'  # a quoted newline: never cut inside
    text = "uri,label\n" + "\n".join(rows) + "\n"
    store = get_store(bucket.root, _FAST)
    listing = bucket.uri("lists", "train.csv")
    store.write_bytes(listing, text.encode())
    whole = list(listing_sources(listing, 1 << 40))
    assert len(whole) == 40 and whole[7].uri == bucket.uri("lists", "img\n7.jpg")
    assert len(listing_ranges(listing, 64)) > 10
    assert list(listing_sources(listing, 64)) == whole
    assert estimate_records(listing) == 42  # the header, 40 rows, one quoted newline
