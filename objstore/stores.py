"""Object stores: one place that maps a URI scheme to a configured client.

``s3://`` goes through fsspec's s3fs, configured the way every AWS tool is: endpoint from
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, credentials from ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` (or the shared config files), region from
``AWS_REGION`` / ``AWS_DEFAULT_REGION``. ``gs://`` goes through google-cloud-storage, which
honours ``STORAGE_EMULATOR_HOST`` and otherwise uses application-default credentials. gcsfs is
not used: pointed at an emulator it spends about a minute probing gRPC before falling back.
A ``StoreSettings`` (``objstore.settings``) given to ``get_store`` overrides any of these with
values, as the pipeline's ``--s3_*`` flags do.

Every call is retried by ``objstore.retry``, not in the client libraries (their own retries are
switched off), so that retry behaviour is the same for both stores, bounded, and visible in the
logs:

* transient failures (HTTP 408/429/5xx, connection resets, timeouts, truncated bodies) are
  retried with exponential backoff and full jitter, up to ``RetryPolicy.max_attempts``;
* permanent failures (403, a missing bucket, a missing object, a bad request) fail at once with
  an ``ObjectStoreError`` whose message names the URI.

Credentials never appear in messages: every message built here goes through ``redact``, and
each store installs ``install_log_redaction`` for the process.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import fnmatch
import hashlib
import json
import os
import random
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from objstore.errors import (
    ObjectAccessError,
    ObjectNotFoundError,
    ObjectStoreError,
    ShortReadError,
    describe,
    error_code,
)
from objstore.redaction import install_log_redaction, redact, register_secret
from objstore.retry import Failure, RetryPolicy, retry_call
from objstore.settings import StoreSettings
from objstore.uris import parse_uri

__all__ = ["GCSStore", "ObjectInfo", "ObjectStore", "S3Store", "get_store"]

_T = TypeVar("_T")
# Where the size a chunked read expects came from, and when a different size means it changed.
_PUBLISHED_SIZE = ("dataset.json", "after the dataset was published")
_SIZE_AT_START = ("its size when the read began", "while it was being read")


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """One object: its URI, size in bytes and, where the listing gives it, its last
    modification time (seconds since the epoch; not compared: two listings of the same objects
    are equal)."""

    uri: str
    size: int
    mtime: float | None = dataclasses.field(default=None, compare=False)


class ObjectStore(abc.ABC):
    """A bucket store reached through one client, with bounded retries on every call.

    Subclasses implement the ``_raw_*`` methods as single attempts that raise the client's own
    exceptions; this class classifies them, retries the transient ones and turns the rest into
    ``ObjectStoreError`` messages that name the URI.
    """

    scheme: str = ""

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        *,
        seed: int | None = None,
        settings: StoreSettings | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.settings = settings or StoreSettings()
        self._rng = random.Random(seed)
        install_log_redaction()

    @property
    def credentials_hint(self) -> str:
        """What to check when a call is refused: where this store's credentials come from."""
        return ""

    # -- single attempts, implemented per client ------------------------------------------------

    @abc.abstractmethod
    def _raw_size(self, bucket: str, key: str) -> int: ...

    @abc.abstractmethod
    def _raw_read(self, bucket: str, key: str, start: int | None, end: int | None) -> bytes: ...

    @abc.abstractmethod
    def _raw_write(self, bucket: str, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _raw_upload(self, bucket: str, key: str, local_path: str) -> None: ...

    @abc.abstractmethod
    def _raw_list(self, bucket: str, prefix: str) -> list[tuple[str, int]]: ...

    @abc.abstractmethod
    def _raw_list_level(
        self, bucket: str, prefix: str
    ) -> tuple[list[str], list[tuple[str, int, float | None]]]:
        """One delimiter listing: the common prefixes (``a/b/``) and ``(key, size, mtime)`` of
        the objects directly under ``prefix``, every page."""

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

        def final_error(failure: Failure) -> ObjectStoreError:
            if not failure.transient:
                return self._permanent_error(
                    action, uri, failure.exc, failure.status, failure.attempts
                )
            return ObjectStoreError(
                f"{uri}: {action} failed after {failure.attempts} attempts over "
                f"{failure.elapsed_s:.1f}s (transient errors; last: {describe(failure.exc)})",
                uri=uri,
                transient=True,
                attempts=failure.attempts,
            )

        return retry_call(
            fn, policy=self.retry, action=action, uri=uri, rng=self._rng, on_failure=final_error
        )

    def _permanent_error(
        self, action: str, uri: str, exc: BaseException, status: int | None, attempt: int
    ) -> ObjectStoreError:
        code = error_code(exc)
        detail = describe(exc)
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
                raise ShortReadError(f"got {len(data)} of {end - start} bytes")
            return data

        return self.call(f"read bytes [{start}, {end})", uri, attempt)

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Writes a whole object (one request; replaced atomically by the store)."""
        _, bucket, key = parse_uri(uri)
        if not key:
            raise ValueError(f"cannot write to a bucket root: {redact(uri)!r}")
        self.call("write", uri, lambda: self._raw_write(bucket, key, data))

    def upload(self, uri: str, local_path: str) -> None:
        """Writes the local file ``local_path`` as the whole object ``uri`` (streamed; large
        files in parts). Readers see the whole object or the one it replaces, never a part.

        Raises:
          ValueError: if ``uri`` is a bucket root.
          FileNotFoundError: if ``local_path`` does not exist.
          ObjectStoreError: see ``call``.
        """
        _, bucket, key = parse_uri(uri)
        if not key:
            raise ValueError(f"cannot write to a bucket root: {redact(uri)!r}")
        if not os.path.isfile(local_path):
            raise FileNotFoundError(f"{local_path}: no such file to upload to {redact(uri)}")
        self.call("write", uri, lambda: self._raw_upload(bucket, key, local_path))

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

    def list_one_level(self, uri: str) -> tuple[builtins.list[str], builtins.list[ObjectInfo]]:
        """What is directly under the "directory" ``uri``: a delimiter listing, every page.

        Returns:
          ``(subdirectories, files)``: the URIs of the prefixes one level down, without their
          trailing ``/``, sorted; and the objects directly under ``uri/`` with their sizes and
          modification times, sorted by URI (a ``uri/`` marker object itself is left out). A
          prefix holding nothing gives two empty lists.

        Raises:
          ObjectNotFoundError: if the bucket does not exist.
          ObjectAccessError, ObjectStoreError: see ``call``.
        """
        scheme, bucket, key = parse_uri(uri.rstrip("/"))
        prefix = f"{key}/" if key else ""
        prefixes, rows = self.call(
            "list one level", uri, lambda: self._raw_list_level(bucket, prefix)
        )
        base = f"{scheme}://{bucket}/"
        dirs = sorted({base + p.rstrip("/") for p in prefixes})
        files = sorted(
            (ObjectInfo(base + k, size, mtime) for k, size, mtime in rows if k != prefix),
            key=lambda info: info.uri,
        )
        return dirs, files

    def isdir(self, uri: str) -> bool:
        """True if some object lives under ``uri/`` (object stores have no real directories)."""
        _, _, key = parse_uri(uri)
        if not key:
            return self.bucket_exists(uri)
        return bool(self.list(uri.rstrip("/") + "/"))

    def glob(self, pattern: str) -> builtins.list[str]:
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
        digest = hashlib.sha256()
        with open(dest, "wb") as f:
            for data in self._chunks(uri, size, chunk_bytes, _PUBLISHED_SIZE):
                digest.update(data)
                f.write(data)
        return digest.hexdigest()

    def digest(self, uri: str, *, chunk_bytes: int = 8 << 20) -> tuple[int, str]:
        """``(size, SHA-256 hex)`` of an object, streamed in ranged chunks (each retried on
        its own), without keeping it.

        Raises:
          ObjectNotFoundError: if it does not exist.
          ObjectStoreError: if it is refused, or changes size while being read.
        """
        size = self.size(uri)
        digest = hashlib.sha256()
        for data in self._chunks(uri, size, chunk_bytes, _SIZE_AT_START):
            digest.update(data)
        return size, digest.hexdigest()

    def _chunks(
        self, uri: str, size: int, chunk_bytes: int, size_from: tuple[str, str]
    ) -> Iterator[bytes]:
        _, bucket, key = parse_uri(uri)
        for start in range(0, size, chunk_bytes):
            end = min(size, start + chunk_bytes)

            def attempt(start: int = start, end: int = end) -> bytes:
                data = self._raw_read(bucket, key, start, end)
                if len(data) != end - start:
                    self._check_size(uri, bucket, key, size, size_from)
                    raise ShortReadError(f"got {len(data)} of {end - start} bytes")
                return data

            yield self.call(f"read bytes [{start}, {end})", uri, attempt)

    def _check_size(
        self, uri: str, bucket: str, key: str, expected: int, size_from: tuple[str, str]
    ) -> None:
        try:
            actual = self._raw_size(bucket, key)
        except Exception:  # the read is retried; this check only words the final error
            return
        if actual != expected:
            source, when = size_from
            raise ObjectStoreError(
                f"{uri}: object is {actual} bytes but {expected} were expected ({source}); "
                f"it was changed {when}",
                uri=uri,
            )


class S3Store(ObjectStore):
    """``s3://`` through s3fs, configured from the standard AWS environment and config files,
    or from the values of a ``StoreSettings``."""

    scheme = "s3"

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        *,
        seed: int | None = None,
        settings: StoreSettings | None = None,
    ) -> None:
        super().__init__(retry, seed=seed, settings=settings)
        import s3fs

        given = self.settings
        timeout = self.retry.timeout_s
        # Settings left at None are not passed: botocore then resolves AWS_ENDPOINT_URL(_S3),
        # credentials and region itself.
        client_kwargs = {
            name: value
            for name, value in (
                ("region_name", given.s3_region_name),
                ("verify", given.s3_verify),
                ("api_version", given.s3_api_version),
            )
            if value is not None
        }
        self._fs = s3fs.S3FileSystem(
            endpoint_url=given.s3_endpoint_url,
            key=given.s3_access_key_id,
            secret=given.s3_secret_access_key,
            token=given.s3_session_token,
            use_ssl=given.s3_use_ssl,
            client_kwargs=client_kwargs,
            skip_instance_cache=True,
            use_listings_cache=False,
            # Only botocore's retries are switched off, since ``call`` retries.
            config_kwargs={
                "retries": {"total_max_attempts": 1, "mode": "standard"},
                "connect_timeout": timeout,
                "read_timeout": timeout,
            },
        )
        self._fs.retries = 1  # s3fs's own retry loop: one attempt

    @property
    def credentials_hint(self) -> str:
        if self.settings.s3_credentials_given:
            # Each flag is followed by punctuation: redaction hides the word after a flag.
            return "the credentials given (--s3_access_key_id, --s3_secret_access_key) and the bucket's policy"
        return "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the bucket's policy"

    def _raw_size(self, bucket: str, key: str) -> int:
        if not key:
            raise ValueError(f"s3://{bucket}/ is a bucket, not an object")
        # head_object, not fs.info: on a 404 info also lists the key as a "directory".
        return int(self._fs.call_s3("head_object", Bucket=bucket, Key=key)["ContentLength"])

    def _raw_read(self, bucket: str, key: str, start: int | None, end: int | None) -> bytes:
        return self._fs.cat_file(f"{bucket}/{key}", start=start, end=end)

    def _raw_write(self, bucket: str, key: str, data: bytes) -> None:
        self._fs.pipe_file(f"{bucket}/{key}", data)

    def _raw_upload(self, bucket: str, key: str, local_path: str) -> None:
        self._fs.put_file(local_path, f"{bucket}/{key}")

    def _raw_list(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        return [
            (entry["Key"], int(entry["Size"]))
            for page in self._paginate(bucket, prefix)
            for entry in page.get("Contents", [])
        ]

    def _raw_list_level(
        self, bucket: str, prefix: str
    ) -> tuple[list[str], list[tuple[str, int, float | None]]]:
        prefixes: list[str] = []
        rows: list[tuple[str, int, float | None]] = []
        for page in self._paginate(bucket, prefix, delimiter="/"):
            prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
            rows += [
                (o["Key"], int(o["Size"]), o["LastModified"].timestamp())
                for o in page.get("Contents", [])
            ]
        return prefixes, rows

    def _paginate(
        self, bucket: str, prefix: str, delimiter: str | None = None
    ) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if delimiter:
                kwargs["Delimiter"] = delimiter
            if token:
                kwargs["ContinuationToken"] = token
            out = self._fs.call_s3("list_objects_v2", **kwargs)
            yield out
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
    """``gs://`` through google-cloud-storage (``STORAGE_EMULATOR_HOST`` or ADC, or the
    emulator host and project of a ``StoreSettings``)."""

    scheme = "gs"

    def __init__(
        self,
        retry: RetryPolicy | None = None,
        *,
        seed: int | None = None,
        settings: StoreSettings | None = None,
    ) -> None:
        super().__init__(retry, seed=seed, settings=settings)
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

    @property
    def credentials_hint(self) -> str:
        return (
            "the application-default credentials (GOOGLE_APPLICATION_CREDENTIALS or "
            "`gcloud auth application-default login`) and the bucket's IAM policy"
        )

    def _client(self) -> Any:
        # One client per thread: the requests session under it is not documented thread-safe.
        client = getattr(self._local, "client", None)
        if client is None:
            import google.cloud.storage as storage

            project = (
                self.settings.gcs_project
                or os.environ.get("GOOGLE_CLOUD_PROJECT")
                or os.environ.get("GCLOUD_PROJECT")
            )
            host = self.settings.gcs_emulator_host
            if host is None:
                client = storage.Client(project=project)
            else:
                # As the library treats STORAGE_EMULATOR_HOST: that endpoint, no credentials.
                client = storage.Client(
                    project=project,
                    client_options={"api_endpoint": host},
                    use_auth_w_custom_endpoint=False,
                )
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
            # The bytes as stored: an object uploaded with Content-Encoding: gzip is not
            # decompressed on the way (its size and ranges are those of the stored bytes).
            raw_download=True,
            checksum=None if start is not None else "auto",
            retry=None,
            timeout=self._timeout,
        )

    def _raw_write(self, bucket: str, key: str, data: bytes) -> None:
        blob = self._client().bucket(bucket).blob(key)
        blob.upload_from_string(data, retry=None, timeout=self._timeout)

    def _raw_upload(self, bucket: str, key: str, local_path: str) -> None:
        blob = self._client().bucket(bucket).blob(key)
        blob.upload_from_filename(local_path, retry=None, timeout=self._timeout)

    def _raw_list(self, bucket: str, prefix: str) -> list[tuple[str, int]]:
        blobs = self._client().list_blobs(bucket, prefix=prefix, retry=None, timeout=self._timeout)
        return [(blob.name, int(blob.size)) for blob in blobs]

    def _raw_list_level(
        self, bucket: str, prefix: str
    ) -> tuple[list[str], list[tuple[str, int, float | None]]]:
        blobs = self._client().list_blobs(
            bucket, prefix=prefix, delimiter="/", retry=None, timeout=self._timeout
        )
        prefixes: list[str] = []
        rows: list[tuple[str, int, float | None]] = []
        for page in blobs.pages:
            rows += [
                (b.name, int(b.size), b.updated.timestamp() if b.updated else None) for b in page
            ]
            prefixes += list(page.prefixes)
        return prefixes, rows

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


def get_store(
    uri: str, retry: RetryPolicy | None = None, settings: StoreSettings | None = None
) -> ObjectStore:
    """The store for ``uri``'s scheme, configured from the current environment and, where it
    gives a value, from ``settings``.

    Stores are shared per (scheme, retry policy, settings, environment): one client per process
    for each, and changing an endpoint or credential variable gives a new one.

    Raises:
      ValueError: if ``uri`` is not an ``s3://`` or ``gs://`` URI.
    """
    scheme = parse_uri(uri)[0]
    policy = retry or RetryPolicy()
    given = settings or StoreSettings()
    env = tuple(
        hashlib.sha256(os.environ.get(name, "").encode()).hexdigest() for name in _CONFIG_ENV_VARS
    )
    # The process id too: a forked child must not share its parent's client (s3fs's event loop
    # thread does not survive a fork).
    key = (os.getpid(), scheme, policy, given, env)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _STORE_CLASSES[scheme](policy, settings=given)
            _stores[key] = store
        return store
