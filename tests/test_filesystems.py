"""``beam_pipelines.engines.filesystems``: the pipeline's storage helpers go through objstore
with the settings of Beam's ``--s3_*`` flags, against the real S3 (moto) and GCS (emulator)
servers and local directories."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.engines.filesystems import (
    create_empty_file,
    file_digest,
    list_one_level,
    read_object,
    read_range,
    storage_settings,
    write_object,
)
from objstore import ObjectAccessError, ObjectNotFoundError, StoreSettings, get_store
from tests.fixtures.object_store import (
    PLANTED_ACCESS_KEY_ID,
    PLANTED_SECRET,
    BucketEnv,
    Server,
    moto_auth,
)

_WRONG_SECRET = "wr0ng-Fl4g-S3cret-" + "Pm2Ns6Dj9Gh4"


@pytest.fixture()
def beam_options() -> Iterator[None]:
    """Beam's FileSystems options are the process's: set by a test, reset after it."""
    FileSystems.set_options(PipelineOptions([]))
    yield
    FileSystems.set_options(PipelineOptions([]))


def _s3_flags(endpoint: str, secret: str = PLANTED_SECRET) -> list[str]:
    return [
        f"--s3_endpoint_url={endpoint}",
        f"--s3_access_key_id={PLANTED_ACCESS_KEY_ID}",
        f"--s3_secret_access_key={secret}",
        "--s3_region_name=us-east-1",
    ]


def test_storage_settings_are_what_beam_options_say() -> None:
    flags = [*_s3_flags("http://127.0.0.1:9"), "--s3_verify=false", "--s3_disable_ssl"]
    settings = storage_settings(PipelineOptions([*flags, "--project=p-1"]))
    assert settings == StoreSettings(
        s3_endpoint_url="http://127.0.0.1:9",
        s3_access_key_id=PLANTED_ACCESS_KEY_ID,
        s3_secret_access_key=PLANTED_SECRET,
        s3_region_name="us-east-1",
        s3_verify=False,
        s3_use_ssl=False,
        gcs_project="p-1",
    )
    as_dict = {"s3_endpoint_url": "http://127.0.0.1:9", "project": "p-1"}
    assert storage_settings(as_dict) == StoreSettings(
        s3_endpoint_url="http://127.0.0.1:9", gcs_project="p-1"
    )
    assert storage_settings(None) == storage_settings(PipelineOptions([])) == StoreSettings()
    with pytest.raises(ValueError, match="--s3_endpoint_url must be an http:// or https:// URL"):
        storage_settings(PipelineOptions(["--s3_endpoint_url=minio:9000"]))


def test_helpers_use_the_s3_flags_beam_was_given(
    s3_env: BucketEnv,
    moto_server: Server,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    beam_options: None,
) -> None:
    # The environment points nowhere and holds no credentials: only the flags reach moto.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name)
    FileSystems.set_options(PipelineOptions(_s3_flags(moto_server.url)))
    local = tmp_path / "shard.bin"
    local.write_bytes(os.urandom(100_000))

    write_object(s3_env.uri("out", "a.json"), b'{"a": 1}')
    write_object(s3_env.uri("out", "cat", "shard.bin"), local_path=str(local))
    create_empty_file(s3_env.uri("out", "empty"))  # one PUT: Beam's multipart writer cannot

    assert read_object(s3_env.uri("out", "a.json")) == b'{"a": 1}'
    assert read_range(s3_env.uri("out", "cat", "shard.bin"), 5, 15) == local.read_bytes()[5:15]
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    assert file_digest(s3_env.uri("out", "cat", "shard.bin")) == (100_000, digest)
    assert file_digest(s3_env.uri("out", "missing")) is None
    level = list_one_level(s3_env.uri("out"))
    assert level is not None
    dirs, files = level
    assert dirs == [s3_env.uri("out", "cat")]
    assert [(m.path, m.size_in_bytes) for m in files] == [
        (s3_env.uri("out", "a.json"), 8),
        (s3_env.uri("out", "empty"), 0),
    ]
    assert all(abs(m.last_updated_in_seconds - time.time()) < 600 for m in files)
    # Beam's own filesystem, on the same options, sees the same objects.
    assert FileSystems.exists(s3_env.uri("out", "empty"))
    with pytest.raises(ObjectNotFoundError, match=s3_env.uri("out", "missing")):
        read_object(s3_env.uri("out", "missing"))


def test_a_wrong_s3_secret_fails_naming_the_uri_and_the_flags(
    s3_env: BucketEnv,
    moto_server: Server,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    beam_options: None,
) -> None:
    get_store(s3_env.root).write_bytes(s3_env.uri("k.json"), b"{}")
    FileSystems.set_options(PipelineOptions(_s3_flags(moto_server.url, _WRONG_SECRET)))

    with caplog.at_level(logging.DEBUG), moto_auth(moto_server):
        with pytest.raises(ObjectAccessError) as info:
            read_object(s3_env.uri("k.json"))

    message = str(info.value)
    assert message.startswith(f"{s3_env.uri('k.json')}: read refused: access denied (HTTP 403")
    assert "(--s3_access_key_id, --s3_secret_access_key)" in message
    captured = capsys.readouterr()
    assert _WRONG_SECRET not in "\n".join(
        [message, repr(info.value), caplog.text, captured.out, captured.err]
    )


def test_helpers_on_a_gcs_bucket(gcs_env: BucketEnv, beam_options: None) -> None:
    write_object(gcs_env.uri("out", "a.json"), b"[1, 2]")
    create_empty_file(gcs_env.uri("out", "sub", "empty"))

    assert read_range(gcs_env.uri("out", "a.json"), 1, 5) == b"1, 2"
    level = list_one_level(gcs_env.uri("out") + "/")
    assert level is not None
    assert level[0] == [gcs_env.uri("out", "sub")]
    assert [(m.path, m.size_in_bytes) for m in level[1]] == [(gcs_env.uri("out", "a.json"), 6)]
    assert file_digest(gcs_env.uri("out", "sub", "empty")) == (0, hashlib.sha256().hexdigest())
    assert read_object(gcs_env.uri("out", "sub", "empty")) == b""


def test_helpers_on_local_paths(tmp_path: Path, beam_options: None) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.jpg").write_bytes(b"jpeg")
    (tmp_path / "elsewhere").symlink_to(tmp_path / "cat")
    write_object(str(tmp_path / "top.json"), b"{}")  # a temporary name, then renamed
    source = tmp_path / "source.bin"
    source.write_bytes(b"x" * 1000)
    write_object(f"file://{tmp_path}/copy.bin", local_path=str(source))
    create_empty_file(str(tmp_path / "new" / "empty"))

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cat",
        "copy.bin",
        "elsewhere",
        "new",
        "source.bin",
        "top.json",
    ]
    level = list_one_level(str(tmp_path))
    assert level is not None
    assert level[0] == [str(tmp_path / "cat"), str(tmp_path / "new")]
    names = ("copy.bin", "source.bin", "top.json")  # the link to a directory is left out
    assert [m.path for m in level[1]] == [str(tmp_path / name) for name in names]
    assert read_object(str(tmp_path / "top.json")) == b"{}"
    assert read_range(str(tmp_path / "copy.bin"), 10, 20) == b"x" * 10
    assert file_digest(str(tmp_path / "new" / "empty")) == (0, hashlib.sha256().hexdigest())
    assert file_digest(str(tmp_path / "missing")) is None
    with pytest.raises(ValueError, match=r"bytes \[990, 1010\) asked, but the file ends at 1000"):
        read_range(str(tmp_path / "copy.bin"), 990, 1010)
    with pytest.raises(ValueError, match=r"0 <= start < end, got \[5, 5\)"):
        read_range(str(tmp_path / "copy.bin"), 5, 5)
    with pytest.raises(ValueError, match="exactly one of data and local_path"):
        write_object(str(tmp_path / "x"))
    with pytest.raises(FileNotFoundError):
        list_one_level(str(tmp_path / "missing"))


def test_a_scheme_only_beam_serves_gets_no_one_level_listing(beam_options: None) -> None:
    assert list_one_level("hdfs://namenode/data") is None
