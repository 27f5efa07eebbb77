"""``objstore.StoreSettings``: endpoints and credentials given as values reach the real S3 (moto)
and GCS (emulator) servers, a wrong credential fails naming the URI and the flag with the secret
redacted, and bad values are refused naming their flag."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys

import pytest

from objstore import (
    ObjectAccessError,
    RetryPolicy,
    StoreSettings,
    get_store,
    redact,
    storage_for,
)
from tests.fixtures.object_store import (
    PLANTED_ACCESS_KEY_ID,
    PLANTED_SECRET,
    BucketEnv,
    Server,
    moto_auth,
)

_FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, timeout_s=10)
_DEAD = "http://127.0.0.1:1"  # nothing listens there: a client that uses it fails
_WRONG_SECRET = "wr0ng-S3cret-" + "Hj5Kq8Lz3Xc1Vb7N"


def _s3_settings(endpoint: str, **overrides: object) -> StoreSettings:
    fields: dict[str, object] = {
        "s3_endpoint_url": endpoint,
        "s3_access_key_id": PLANTED_ACCESS_KEY_ID,
        "s3_secret_access_key": PLANTED_SECRET,
        "s3_region_name": "us-east-1",
    }
    return StoreSettings(**{**fields, **overrides})  # type: ignore[arg-type]


def test_s3_settings_win_over_the_environment(
    s3_env: BucketEnv, moto_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    get_store(s3_env.root, _FAST).write_bytes(s3_env.uri("d", "a.bin"), b"through the env")
    # The environment now points nowhere and holds no credentials: only the settings work.
    monkeypatch.setenv("AWS_ENDPOINT_URL", _DEAD)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name)
    settings = _s3_settings(moto_server.url, s3_verify="false")
    store = storage_for(s3_env.uri("d"), _FAST, settings)

    assert store.read_bytes(s3_env.uri("d", "a.bin")) == b"through the env"
    store.write_bytes(s3_env.uri("d", "sub", "b.bin"), b"through the settings")
    dirs, files = store.list_one_level(s3_env.uri("d"))
    assert dirs == [s3_env.uri("d", "sub")] and [f.uri for f in files] == [s3_env.uri("d/a.bin")]
    # One client per process, retry policy and settings: equal settings share it.
    assert storage_for(s3_env.uri("x"), _FAST, _s3_settings(moto_server.url, s3_verify=False))
    assert get_store(s3_env.root, _FAST, _s3_settings(moto_server.url, s3_verify="0")) is store
    assert get_store(s3_env.root, _FAST, _s3_settings(moto_server.url)) is not store
    with pytest.raises(OSError, match=s3_env.uri("d", "a.bin")):
        get_store(s3_env.root, _FAST).read_bytes(s3_env.uri("d", "a.bin"))  # the env alone


def test_gcs_emulator_host_and_project_as_values(
    gcs_env: BucketEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    settings = StoreSettings(gcs_emulator_host=gcs_env.server_url, gcs_project="test-project")
    store = storage_for(gcs_env.root, _FAST, settings)

    store.write_bytes(gcs_env.uri("d", "a.bin"), b"abc")
    store.write_bytes(gcs_env.uri("d", "e", "b.bin"), b"de")

    assert store.read_range(gcs_env.uri("d", "a.bin"), 1, 3) == b"bc"
    dirs, files = store.list_one_level(gcs_env.uri("d"))
    assert dirs == [gcs_env.uri("d", "e")] and [(f.uri, f.size) for f in files] == [
        (gcs_env.uri("d", "a.bin"), 3)
    ]


def test_wrong_credentials_fail_once_naming_the_uri_and_the_flags(
    s3_env: BucketEnv,
    moto_server: Server,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    get_store(s3_env.root, _FAST).write_bytes(s3_env.uri("k.bin"), b"data")
    settings = _s3_settings(
        moto_server.url, s3_access_key_id="AKIAWRONGKEY00000001", s3_secret_access_key=_WRONG_SECRET
    )
    store = get_store(s3_env.root, _FAST, settings)

    with caplog.at_level(logging.DEBUG), moto_auth(moto_server):
        # moto now checks signatures: the key is unknown to its IAM, a real 403.
        with pytest.raises(ObjectAccessError) as info:
            store.read_bytes(s3_env.uri("k.bin"))

    message = str(info.value)
    assert message.startswith(f"{s3_env.uri('k.bin')}: read refused: access denied (HTTP 403")
    assert "Check the credentials given (--s3_access_key_id, --s3_secret_access_key)" in message
    assert info.value.attempts == 1  # permanent: not retried
    captured = capsys.readouterr()
    everything = "\n".join(
        [message, repr(info.value), repr(settings), caplog.text, captured.out, captured.err]
    )
    assert _WRONG_SECRET not in everything and "AKIAWRONGKEY00000001" not in everything


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"s3_endpoint_url": "127.0.0.1:9000"}, r"--s3_endpoint_url must be an http:// or https"),
        ({"s3_endpoint_url": ""}, r"--s3_endpoint_url must be an http:// or https:// URL, got ''"),
        ({"gcs_emulator_host": "localhost:4443"}, "STORAGE_EMULATOR_HOST"),
        ({"s3_access_key_id": "AKIAONLYTHEKEY000001"}, "go together: got only --s3_access_key_id"),
        ({"s3_secret_access_key": _WRONG_SECRET}, "got only --s3_secret_access_key"),
        ({"s3_region_name": " "}, "--s3_region_name must be a non-empty string"),
        ({"s3_verify": " "}, "--s3_verify is empty: expected true, false or the path"),
        ({"gcs_project": 7}, "--gcs_project must be a non-empty string, got 7"),
        ({"s3_use_ssl": "no"}, "s3_use_ssl must be a bool"),
    ],
)
def test_bad_settings_name_their_flag(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        StoreSettings(**fields)  # type: ignore[arg-type]
    assert _WRONG_SECRET not in str(info.value)


@pytest.mark.parametrize(
    "given, parsed",
    [
        (None, None),
        ("true", True),
        ("False", False),
        ("0", False),
        (True, True),
        ("/ca.pem", "/ca.pem"),
    ],
)
def test_s3_verify_is_a_bool_or_a_ca_bundle(given: object, parsed: object) -> None:
    assert StoreSettings(s3_verify=given).s3_verify == parsed  # type: ignore[arg-type]


def test_credentials_stay_out_of_repr_and_are_redacted_where_unpickled() -> None:
    secret, token = "unp1ckled-S3cret-Qw7Er4Ty", "unp1ckled-T0ken-Zx8Cv5Bn"
    settings = _s3_settings(_DEAD, s3_secret_access_key=secret, s3_session_token=token)
    assert secret not in repr(settings) and token not in repr(settings)
    assert redact(f"{secret} {token}") == "*** ***"
    # A worker that receives the settings pickled (a fresh process) hides them as well.
    code = (
        "import pickle, sys\nfrom objstore import redact\n"
        "s = pickle.loads(sys.stdin.buffer.read())\n"
        "print(redact(f'{s.s3_secret_access_key} {s.s3_session_token} {s.s3_access_key_id}'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(settings),
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.decode().strip() == "*** *** ***"
    assert pickle.loads(pickle.dumps(settings)) == settings
