"""Object storage: one place that maps a URI scheme to a configured client.

``s3://`` goes through fsspec's s3fs, configured the way every AWS tool is: endpoint from
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, credentials from ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` (or the shared config files), region from
``AWS_REGION`` / ``AWS_DEFAULT_REGION``. ``gs://`` goes through google-cloud-storage, which
honours ``STORAGE_EMULATOR_HOST`` and otherwise uses application-default credentials. gcsfs is
not used: pointed at an emulator it spends about a minute probing gRPC before falling back.

Every call is retried here, not in the client libraries (their own retries are switched off), so
that retry behaviour is the same for both stores, bounded, and visible in the logs:

* transient failures (HTTP 408/429/5xx, connection resets, timeouts, truncated bodies) are
  retried with exponential backoff and full jitter, up to ``RetryPolicy.max_attempts``;
* permanent failures (403, a missing bucket, a missing object, a bad request) fail at once with
  an ``ObjectStoreError`` whose message names the URI.

Credentials never appear in messages: every message built here goes through ``redact``, and
``install_log_redaction`` makes every log record of the process pass through it as well.
"""

from __future__ import annotations

import abc
import dataclasses
import fnmatch
import hashlib
import http.client
import json
import logging
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = [
    "SCHEMES",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectNotFoundError",
    "ObjectAccessError",
    "RetryPolicy",
    "S3Store",
    "GCSStore",
    "get_store",
    "install_log_redaction",
    "is_object_store_uri",
    "is_transient",
    "join_uri",
    "parse_uri",
    "reads_natively",
    "redact",
    "register_secret",
]

_log = logging.getLogger(__name__)

SCHEMES = ("s3", "gs")

_T = TypeVar("_T")

# ----------------------------------------------------------------------------------------------
# Redaction
# ----------------------------------------------------------------------------------------------

# Environment variables whose values are credentials (or identify them) wherever they appear.
_SECRET_ENV_VARS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ACCESS_KEY_ID",
)
_MIN_SECRET_LEN = 6
_REDACTED = "***"
_registered_secrets: set[str] = set()
_secrets_lock = threading.Lock()

_REDACT_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM private keys (service-account JSON).
    (
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
        _REDACTED,
    ),
    # Command-line flags: --s3_secret_access_key VALUE / --s3_secret_access_key=VALUE.
    (
        re.compile(
            r"(?i)(--s3_(?:secret_access_key|session_token|access_key_id))(\s*=\s*|\s+)(\S+)"
        ),
        r"\1\2" + _REDACTED,
    ),
    # key=value, key: value and JSON "key": "value" forms of credential fields.
    (
        re.compile(
            r"(?i)((?:aws_)?(?:secret_access_key|access_key_id|session_token|security_token)"
            r"|private_key(?:_id)?|client_secret|refresh_token|access_token|password)"
            r"(['\"]?\s*[:=]\s*['\"]?)([^\s'\",&}]+)"
        ),
        r"\1\2" + _REDACTED,
    ),
    # Pre-signed URL parameters and signature headers.
    (
        re.compile(r"(?i)(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s'\"]+"),
        r"\1" + _REDACTED,
    ),
    (re.compile(r"(?i)(Credential=)[^,\s'\"]+"), r"\1" + _REDACTED),
    (re.compile(r"(?i)(Signature=)[0-9a-f]{16,}"), r"\1" + _REDACTED),
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\n]+"), r"\1" + _REDACTED),
    # user:password@ inside URIs.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1" + _REDACTED + "@"),
)


def register_secret(value: str | None) -> None:
    """Adds a credential value (e.g. from a command-line flag) that ``redact`` must hide.

    Values shorter than 6 characters are ignored: hiding them would garble ordinary text.
    """
    if value and len(value) >= _MIN_SECRET_LEN:
        with _secrets_lock:
            _registered_secrets.add(value)


def _known_secrets() -> list[str]:
    values = [os.environ.get(name, "") for name in _SECRET_ENV_VARS]
    with _secrets_lock:
        values.extend(_registered_secrets)
    # Longest first, so that a secret containing another is replaced whole.
    return sorted({v for v in values if len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True)


def redact(text: object) -> str:
    """Returns ``str(text)`` with credentials replaced by ``***``.

    It hides the values of the AWS credential variables, every value given to
    ``register_secret``, and anything that looks like a credential field, a signature or a
    password inside a URI.
    """
    out = str(text)
    for secret in _known_secrets():
        out = out.replace(secret, _REDACTED)
    for pattern, replacement in _REDACT_PATTERNS:
        out = pattern.sub(replacement, out)
    return out


_factory_lock = threading.Lock()
_factory_installed = False


def install_log_redaction() -> None:
    """Makes every log record created in this process pass through ``redact``.

    A record factory is used rather than a handler filter because it also covers handlers and
    loggers created later (Beam, botocore and absl add their own). Idempotent.
    """
    global _factory_installed
    with _factory_lock:
        if _factory_installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            try:
                message = record.getMessage()
            except Exception:  # a malformed record is logging's problem, not ours
                return record
            record.msg, record.args = redact(message), None
            if record.exc_info and record.exc_info[1] is not None:
                record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
                record.exc_info = None
            return record

        logging.setLogRecordFactory(factory)
        _factory_installed = True


# ----------------------------------------------------------------------------------------------
# URIs
# ----------------------------------------------------------------------------------------------


def parse_uri(uri: str) -> tuple[str, str, str]:
    """Splits ``scheme://bucket/key`` into ``(scheme, bucket, key)``; key may be empty.

    Raises:
      ValueError: if ``uri`` is not an ``s3://`` or ``gs://`` URI with a bucket.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"expected an s3:// or gs:// URI, got {redact(uri)!r}")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"URI {redact(uri)!r} has no bucket name")
    return scheme, bucket, key


def is_object_store_uri(path: str) -> bool:
    """True for ``s3://`` and ``gs://`` URIs."""
    return isinstance(path, str) and path.partition("://")[0] in SCHEMES and "://" in path


def join_uri(root: str, *parts: str) -> str:
    """Joins a URI and ``/``-separated relative parts."""
    out = root.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def reads_natively(path: str) -> bool:
    """True if TensorFlow should open ``path`` itself rather than through the shard cache.

    Local paths and ``file://`` are read directly. ``gs://`` is read by TensorFlow's own GCS
    filesystem, except when ``STORAGE_EMULATOR_HOST`` is set (TensorFlow ignores it and would go
    to Google). TensorFlow 2.21 has no ``s3://`` filesystem, so S3 always goes through the cache.
    """
    scheme = path.partition("://")[0] if "://" in path else ""
    if scheme == "s3":
        return False
    if scheme == "gs":
        return not os.environ.get("STORAGE_EMULATOR_HOST")
    return True


# ----------------------------------------------------------------------------------------------
# Errors and retries
# ----------------------------------------------------------------------------------------------


class ObjectStoreError(OSError):
    """An object-store call failed. The message names the URI and never holds credentials.

    Attributes:
      uri: the object or prefix the call was about.
      transient: True if the last failure was transient (retries were exhausted).
      attempts: how many attempts were made.
    """

    def __init__(self, message: str, *, uri: str, transient: bool = False, attempts: int = 1):
        super().__init__(redact(message))
        self.uri = uri
        self.transient = transient
        self.attempts = attempts

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ObjectNotFoundError(ObjectStoreError, FileNotFoundError):
    """The bucket or the object does not exist."""


class ObjectAccessError(ObjectStoreError, PermissionError):
    """The credentials are missing, wrong, or not allowed to do this (HTTP 401/403)."""


_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter.

    Attempt ``n`` (1-based) that fails transiently is followed by a sleep drawn uniformly from
    ``[0, min(max_backoff_s, initial_backoff_s * multiplier ** (n - 1))]``.

    Attributes:
      max_attempts: total attempts per call, including the first (>= 1).
      initial_backoff_s: the backoff cap after the first failure.
      max_backoff_s: the largest backoff cap.
      multiplier: growth of the cap per attempt (>= 1).
      timeout_s: per-request connect/read timeout.
    """

    max_attempts: int = 6
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not self.initial_backoff_s >= 0:
            raise ValueError(f"initial_backoff_s must be >= 0, got {self.initial_backoff_s!r}")
        if not self.max_backoff_s >= self.initial_backoff_s:
            raise ValueError(
                f"max_backoff_s must be >= initial_backoff_s ({self.initial_backoff_s}), got "
                f"{self.max_backoff_s!r}"
            )
        if not self.multiplier >= 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")

    def backoff_cap(self, attempt: int) -> float:
        """The largest sleep after failed attempt ``attempt`` (1-based)."""
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    status_code = getattr(response, "status_code", None)  # requests / google-resumable-media
    if isinstance(status_code, int):
        return status_code
    # google.api_core's GoogleAPICallError and Beam's S3ClientError carry the status as .code.
    code = getattr(exc, "code", None)
    module = type(exc).__module__
    if isinstance(code, int) and 100 <= code < 600 and module.startswith(("google", "apache_beam")):
        return code
    return None


def _error_code(exc: BaseException) -> str:
    for e in _exception_chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
    return ""


_TRANSIENT_MODULE_PREFIXES = (
    "aiohttp",
    "urllib3.exceptions",
    "requests.exceptions",
    "google.auth.exceptions",
    "google.resumable_media",
    "google.cloud.storage.exceptions",
)
_TRANSIENT_BOTOCORE_NAMES = frozenset(
    {
        "HTTPClientError",
        "ConnectionError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ProxyConnectionError",
        "ResponseParserError",
    }
)


def _status_and_transient(exc: BaseException) -> tuple[int | None, bool]:
    """The HTTP status behind ``exc`` (if any) and whether retrying may help."""
    for e in _exception_chain(exc):
        status = _http_status(e)
        if status is not None:
            return status, status in _TRANSIENT_STATUS
    for e in _exception_chain(exc):
        if isinstance(e, (PermissionError, FileNotFoundError)):
            return None, False
        if isinstance(
            e,
            (
                ConnectionError,
                TimeoutError,
                socket.timeout,
                http.client.IncompleteRead,
                http.client.RemoteDisconnected,
                _ShortReadError,
            ),
        ):
            return None, True
        module = type(e).__module__
        if module.startswith("botocore") and type(e).__name__ in _TRANSIENT_BOTOCORE_NAMES:
            return None, True
        if module.startswith(_TRANSIENT_MODULE_PREFIXES):
            # Their HTTP errors carried a status above; what is left is transport trouble or
            # a failed download checksum, both worth another attempt.
            return None, True
        if module.startswith("fsspec") and "Timeout" in type(e).__name__:
            return None, True
    return None, False


def is_transient(exc: BaseException) -> bool:
    """True if retrying may help: HTTP 408/429/5xx, connection resets, timeouts, short bodies.

    Works on the exceptions of s3fs/botocore, google-cloud-storage, requests/urllib3, aiohttp
    and Beam's S3 client, following ``__cause__`` / ``__context__`` chains.
    """
    return _status_and_transient(exc)[1]


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if len(text) > 300:
        text = text[:300] + "…"
    return redact(f"{type(exc).__name__}: {text}")


class _ShortReadError(Exception):
    """A ranged read returned fewer bytes than asked for (a body cut short in transit)."""


# ----------------------------------------------------------------------------------------------
# Stores
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """One object: its URI and size in bytes."""

    uri: str
    size: int


class ObjectStore(abc.ABC):
    """A bucket store reached through one client, with bounded retries on every call.

    Subclasses implement the ``_raw_*`` methods as single attempts that raise the client's own
    exceptions; this class classifies them, retries the transient ones and turns the rest into
    ``ObjectStoreError`` messages that name the URI.
    """

    scheme: str = ""
    credentials_hint: str = ""

    def __init__(self, retry: RetryPolicy | None = None, *, seed: int | None = None) -> None:
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        install_log_redaction()

    # -- single attempts, implemented per client ------------------------------------------------

    @abc.abstractmethod
    def _raw_size(self, bucket: str, key: str) -> int: ...

    @abc.abstractmethod
    def _raw_read(self, bucket: str, key: str, start: int | None, end: int | None) -> bytes: ...

    @abc.abstractmethod
    def _raw_write(self, bucket: str, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _raw_list(self, bucket: str, prefix: str) -> list[tuple[str, int]]: ...

    @abc.abstractmethod
    def _raw_delete(self, bucket: str, key: str) -> None: ...

    @abc.abstractmethod
    def _raw_bucket_exists(self, bucket: str) -> bool: ...

    @abc.abstractmethod
    def _raw_create_bucket(self, bucket: str) -> None: ...

    # -- retries and error mapping ---------------------------------------------------------------

    def call(self, action: str, uri: str, fn: Callable[[], _T]) -> _T:
        """Runs ``fn`` with this store's retry policy.

        Args:
          action: what is being done, for messages ("read", "list"…).
          uri: the URI it is done to, for messages.
          fn: one attempt.

        Returns:
          What ``fn`` returns.

        Raises:
          ObjectNotFoundError: the bucket or object does not exist.
          ObjectAccessError: HTTP 401/403.
          ObjectStoreError: any other permanent failure, or transient failures on every attempt.
        """
        policy = self.retry
        started = time.monotonic()
        for attempt in range(1, policy.max_attempts + 1):
            try:
                return fn()
            except ObjectStoreError:
                raise
            except Exception as e:  # classified below; nothing is swallowed
                status, transient = _status_and_transient(e)
                if not transient:
                    raise self._permanent_error(action, uri, e, status, attempt) from None
                if attempt == policy.max_attempts:
                    raise ObjectStoreError(
                        f"{uri}: {action} failed after {attempt} attempts over "
                        f"{time.monotonic() - started:.1f}s (transient errors; last: "
                        f"{_describe(e)})",
                        uri=uri,
                        transient=True,
                        attempts=attempt,
                    ) from None
                with self._rng_lock:
                    delay = self._rng.uniform(0.0, policy.backoff_cap(attempt))
                _log.warning(
                    "%s: %s failed (%s); retry %d of %d in %.2fs",
                    uri,
                    action,
                    _describe(e),
                    attempt,
                    policy.max_attempts - 1,
                    delay,
                )
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _permanent_error(
        self, action: str, uri: str, exc: BaseException, status: int | None, attempt: int
    ) -> ObjectStoreError:
        code = _error_code(exc)
        detail = _describe(exc)
        if status in (401, 403) or isinstance(exc, PermissionError) or "AccessDenied" in code:
            return ObjectAccessError(
                f"{uri}: {action} refused: access denied (HTTP {status or 403} {code}). "
                f"Check {self.credentials_hint}. [{detail}]",
                uri=uri,
                attempts=attempt,
            )
        if status == 404 or isinstance(exc, FileNotFoundError):
            _, bucket, _ = parse_uri(uri)
            missing_bucket = code == "NoSuchBucket" or (
                code != "NoSuchKey" and not self._bucket_exists_quietly(bucket)
            )
            what = f"bucket {bucket!r} does not exist" if missing_bucket else "object not found"
            return ObjectNotFoundError(f"{uri}: {action} failed: {what}", uri=uri, attempts=attempt)
        return ObjectStoreError(
            f"{uri}: {action} failed (permanent error, HTTP {status}): {detail}",
            uri=uri,
            attempts=attempt,
        )

    def _bucket_exists_quietly(self, bucket: str) -> bool:
        try:
            return self._raw_bucket_exists(bucket)
        except Exception:  # only used to word a message; assume the bucket is there
            return True

    # -- public operations -----------------------------------------------------------------------

    def size(self, uri: str) -> int:
        """Size in bytes of one object.

        Raises:
          ObjectNotFoundError, ObjectAccessError, ObjectStoreError: see ``call``.
        """
        _, bucket, key = parse_uri(uri)
        return self.call("stat", uri, lambda: self._raw_size(bucket, key))

    def exists(self, uri: str) -> bool:
        """True if the object exists; False if it or its bucket does not."""
        try:
            self.size(uri)
            return True
        except ObjectNotFoundError:
            return False

    def read_bytes(self, uri: str) -> bytes:
        """Reads a whole (small) object such as ``dataset.json``."""
        _, bucket, key = parse_uri(uri)
        return self.call("read", uri, lambda: self._raw_read(bucket, key, None, None))

    def read_range(self, uri: str, start: int, end: int) -> bytes:
        """Reads bytes ``[start, end)``; a short body is retried as a transient failure."""
        if not 0 <= start < end:
            raise ValueError(f"byte range must satisfy 0 <= start < end, got [{start}, {end})")
        _, bucket, key = parse_uri(uri)

        def attempt() -> bytes:
            data = self._raw_read(bucket, key, start, end)
            if len(data) != end - start:
                raise _ShortReadError(f"got {len(data)} of {end - start} bytes")
            return data

        return self.call(f"read bytes [{start}, {end})", uri, attempt)

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Writes a whole object (one request; replaced atomically by the store)."""
        _, bucket, key = parse_uri(uri)
        if not key:
            raise ValueError(f"cannot write to a bucket root: {redact(uri)!r}")
        self.call("write", uri, lambda: self._raw_write(bucket, key, data))

    def delete(self, uri: str) -> None:
        """Deletes one object; a missing object is not an error."""
        _, bucket, key = parse_uri(uri)
        try:
            self.call("delete", uri, lambda: self._raw_delete(bucket, key))
        except ObjectNotFoundError:
            pass

    def list(self, prefix_uri: str) -> list[ObjectInfo]:
        """Every object whose URI starts with ``prefix_uri``, sorted by URI."""
        scheme, bucket, prefix = parse_uri(prefix_uri)
        rows = self.call("list", prefix_uri, lambda: self._raw_list(bucket, prefix))
        return sorted(
            (ObjectInfo(f"{scheme}://{bucket}/{key}", size) for key, size in rows),
            key=lambda info: info.uri,
        )

    def isdir(self, uri: str) -> bool:
        """True if some object lives under ``uri/`` (object stores have no real directories)."""
        _, _, key = parse_uri(uri)
        if not key:
            return self.bucket_exists(uri)
        return bool(self.list(uri.rstrip("/") + "/"))

    def glob(self, pattern: str) -> list[str]:
        """URIs matching a glob (``*``, ``?``, ``[…]``; ``*`` does not cross ``/``), sorted."""
        scheme, bucket, key = parse_uri(pattern)
        literal = re.split(r"[*?\[]", key, maxsplit=1)[0]
        regex = re.compile(fnmatch.translate(key).replace(".*", "[^/]*"))
        return [
            info.uri
            for info in self.list(f"{scheme}://{bucket}/{literal}")
            if regex.match(parse_uri(info.uri)[2])
        ]

    def bucket_exists(self, uri: str) -> bool:
        """True if the bucket of ``uri`` exists."""
        _, bucket, _ = parse_uri(uri)
        return self.call("check bucket", uri, lambda: self._raw_bucket_exists(bucket))

    def create_bucket(self, uri: str) -> None:
        """Creates the bucket of ``uri`` (used by tests and benchmarks against local servers)."""
        _, bucket, _ = parse_uri(uri)
        self.call("create bucket", uri, lambda: self._raw_create_bucket(bucket))

    def download(
        self,
        uri: str,
        dest: str,
        *,
        expected_size: int | None = None,
        chunk_bytes: int = 8 << 20,
    ) -> str:
        """Streams an object to a local file in ranged chunks and returns its SHA-256 (hex).

        Each chunk is retried on its own, so a connection reset costs one chunk, not the file.
        With ``expected_size`` (from ``dataset.json``) no metadata request is made; a body
        shorter than expected is checked against the object's real size. ``dest`` is written in
        place; the caller renames it once the hash is checked.

        Raises:
          ObjectStoreError: if the object is missing, refused, or not ``expected_size`` bytes.
        """
        size = self.size(uri) if expected_size is None else expected_size
        _, bucket, key = parse_uri(uri)
        digest = hashlib.sha256()
        with open(dest, "wb") as f:
            for start in range(0, size, chunk_bytes):
                end = min(size, start + chunk_bytes)

                def attempt(start: int = start, end: int = end) -> bytes:
                    data = self._raw_read(bucket, key, start, end)
                    if len(data) != end - start:
                        self._check_size(uri, bucket, key, size)
                        raise _ShortReadError(f"got {len(data)} of {end - start} bytes")
                    return data

                data = self.call(f"read bytes [{start}, {end})", uri, attempt)
                digest.update(data)
                f.write(data)
        return digest.hexdigest()

    def _check_size(self, uri: str, bucket: str, key: str, expected: int) -> None:
        try:
            actual = self._raw_size(bucket, key)
        except Exception:  # the read is retried; this check only words the final error
            return
        if actual != expected:
            raise ObjectStoreError(
                f"{uri}: object is {actual} bytes but {expected} were expected (dataset.json); "
                f"it was changed after the dataset was published",
                uri=uri,
            )


class S3Store(ObjectStore):
    """``s3://`` through s3fs, configured from the standard AWS environment and config files."""

    scheme = "s3"
    credentials_hint = (
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the bucket's policy"
    )

    def __init__(self, retry: RetryPolicy | None = None, *, seed: int | None = None) -> None:
        super().__init__(retry, seed=seed)
        import s3fs

        timeout = self.retry.timeout_s
        self._fs = s3fs.S3FileSystem(
            skip_instance_cache=True,
            use_listings_cache=False,
            # botocore resolves AWS_ENDPOINT_URL(_S3), credentials and region itself; only its
            # retries are switched off, since ``call`` retries.
            config_kwargs={
                "retries": {"total_max_attempts": 1, "mode": "standard"},
                "connect_timeout": timeout,
                "read_timeout": timeout,
            },
        )
        self._fs.retries = 1  # s3fs's own retry loop: one attempt

    def _raw_size(self, bucket: str, key: str) -> int:
        if not key:
            raise ValueError(f"s3://{bucket}/ is a bucket, not an object")
        # head_object, not fs.info: on a 404 info also lists the key as a "directory".
        return int(self._fs.call_s3("head_object", Bucket=bucket, Key=key)["ContentLength"])

    def _raw_read(self, bucket: str, key: str, start: int | None, end: int | None) -> bytes:
        return self._fs.cat_file(f"{bucket}/{key}", start=start, end=end)

    def _raw_write(self, bucket: str, key: str, data: bytes) -> None:
        self._fs.pipe_file(f"{bucket}/{key}", data)

    def _raw_list(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        return [
            (entry["Key"], int(entry["Size"]))
            for page in self._paginate(bucket, prefix)
            for entry in page
        ]

    def _paginate(self, bucket: str, prefix: str) -> Iterator[list[dict[str, Any]]]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            out = self._fs.call_s3("list_objects_v2", **kwargs)
            yield out.get("Contents", [])
            token = out.get("NextContinuationToken")
            if not out.get("IsTruncated") or not token:
                return

    def _raw_delete(self, bucket: str, key: str) -> None:
        self._fs.call_s3("delete_object", Bucket=bucket, Key=key)

    def _raw_bucket_exists(self, bucket: str) -> bool:
        try:
            self._fs.call_s3("head_bucket", Bucket=bucket)
            return True
        except FileNotFoundError:
            return False

    def _raw_create_bucket(self, bucket: str) -> None:
        self._fs.call_s3("create_bucket", Bucket=bucket)


class GCSStore(ObjectStore):
    """``gs://`` through google-cloud-storage (``STORAGE_EMULATOR_HOST`` or ADC)."""

    scheme = "gs"
    credentials_hint = (
        "the application-default credentials (GOOGLE_APPLICATION_CREDENTIALS or "
        "`gcloud auth application-default login`) and the bucket's IAM policy"
    )

    def __init__(self, retry: RetryPolicy | None = None, *, seed: int | None = None) -> None:
        super().__init__(retry, seed=seed)
        self._local = threading.local()
        self._register_adc_secrets()
        # The client otherwise fetches bucket metadata in background threads, with its own
        # retries, only to label trace spans: extra requests this layer cannot bound.
        os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")

    @staticmethod
    def _register_adc_secrets() -> None:
        path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if not path or not os.path.isfile(path):
            return
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            return
        if isinstance(info, dict):
            for field in ("private_key", "private_key_id", "client_secret", "refresh_token"):
                value = info.get(field)
                if isinstance(value, str):
                    register_secret(value)

    def _client(self) -> Any:
        # One client per thread: the requests session under it is not documented thread-safe.
        client = getattr(self._local, "client", None)
        if client is None:
            from google.cloud import storage

            project = os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("GCLOUD_PROJECT")
            client = storage.Client(project=project)
            self._local.client = client
        return client

    @property
    def _timeout(self) -> tuple[float, float]:
        return (min(10.0, self.retry.timeout_s), self.retry.timeout_s)

    def _raw_size(self, bucket: str, key: str) -> int:
        from google.api_core import exceptions

        if not key:
            raise ValueError(f"gs://{bucket}/ is a bucket, not an object")
        blob = self._client().bucket(bucket).get_blob(key, retry=None, timeout=self._timeout)
        if blob is None:
            raise exceptions.NotFound(f"gs://{bucket}/{key}")
        return int(blob.size)

    def _raw_read(self, bucket: str, key: str, start: int | None, end: int | None) -> bytes:
        blob = self._client().bucket(bucket).blob(key)
        return blob.download_as_bytes(
            start=start,
            end=None if end is None else end - 1,  # inclusive in this API
            checksum=None if start is not None else "auto",
            retry=None,
            timeout=self._timeout,
        )

    def _raw_write(self, bucket: str, key: str, data: bytes) -> None:
        blob = self._client().bucket(bucket).blob(key)
        blob.upload_from_string(data, retry=None, timeout=self._timeout)

    def _raw_list(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        blobs = self._client().list_blobs(bucket, prefix=prefix, retry=None, timeout=self._timeout)
        return [(blob.name, int(blob.size)) for blob in blobs]

    def _raw_delete(self, bucket: str, key: str) -> None:
        self._client().bucket(bucket).blob(key).delete(retry=None, timeout=self._timeout)

    def _raw_bucket_exists(self, bucket: str) -> bool:
        from google.api_core import exceptions

        try:
            self._client().get_bucket(bucket, retry=None, timeout=self._timeout)
            return True
        except exceptions.NotFound:
            return False

    def _raw_create_bucket(self, bucket: str) -> None:
        self._client().create_bucket(bucket, retry=None, timeout=self._timeout)


_STORE_CLASSES: dict[str, type[ObjectStore]] = {"s3": S3Store, "gs": GCSStore}
_CONFIG_ENV_VARS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
)
_stores: dict[tuple[Any, ...], ObjectStore] = {}
_stores_lock = threading.Lock()


def get_store(uri: str, retry: RetryPolicy | None = None) -> ObjectStore:
    """The store for ``uri``'s scheme, configured from the current environment.

    Stores are shared per (scheme, retry policy, environment): changing an endpoint or credential
    variable gives a new client.

    Raises:
      ValueError: if ``uri`` is not an ``s3://`` or ``gs://`` URI.
    """
    scheme = parse_uri(uri)[0]
    policy = retry or RetryPolicy()
    env = tuple(
        hashlib.sha256(os.environ.get(name, "").encode()).hexdigest() for name in _CONFIG_ENV_VARS
    )
    key = (scheme, policy, env)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _STORE_CLASSES[scheme](policy)
            _stores[key] = store
        return store
