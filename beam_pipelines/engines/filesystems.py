"""The pipeline's own storage helpers, through ``objstore``: the reader's and the tools' layer.

Local paths, ``file://``, ``s3://`` and ``gs://`` go through ``objstore.storage_for``: one
client per process and settings, ``objstore``'s retry policy and loop, errors that name the URI
and never a credential. Any other scheme Beam has a filesystem for (``hdfs://``…) goes through
Beam's FileSystems, its reads and writes still retried by ``objstore.retry_call``. Beam's own
transforms (``MatchFiles``, ``ReadMatches``, TFRecord IO) and the pipeline's ``FileSystems``
calls (exists, match, delete, rename) keep Beam's FileSystems, which are Beam's public IO.

Where the endpoint and credentials come from. The pipeline's ``--s3_*`` flags (and ``--project``
for GCS) become an ``objstore.StoreSettings`` (``storage_settings``); fields left unset fall
back to the standard environment (``AWS_*``, ``STORAGE_EMULATOR_HOST``, application-default
credentials). The settings are read, in each process, from the options Beam handed
``FileSystems.set_options`` (``beam_internals.filesystems_options``), not pickled into each
DoFn, because:

* the helpers then use the very options Beam's own filesystems use in the same process: a DoFn
  that writes a temporary with ``FileSystems.create`` and reads it back with ``read_range``
  cannot reach two different endpoints, which two sources of settings would allow;
* every place that stores does so, with nothing to thread through: a new DoFn, or a helper
  called from deep inside one, cannot forget the settings and silently fall back to the
  environment, as one whose constructor missed them would;
* Beam puts the options there wherever its SDK harness runs a worker (the in-process runner's
  workers and the launcher through ``Pipeline``; ``multi_processing``, Flink, Spark and
  Dataflow workers through ``sdk_worker_main``), and the launcher's checks before any
  ``Pipeline`` exists call ``FileSystems.set_options`` themselves;
* the credentials travel once, in the pipeline options Beam already ships to its workers, not
  again inside every pickled DoFn.

The price is one private read, fenced in ``beam_internals`` with a contract test that fails
naming the Beam change. On the workers of a runner that never calls
``FileSystems.set_options`` these helpers use the standard environment alone.

What the helpers add to Beam's FileSystems:

* ``create_empty_file``: Beam's S3 filesystem writes every file as a multipart upload and
  completes it with no parts when the file is empty, which S3 (and moto) reject with
  ``MalformedXML``; empty shards and reports are legitimate.
* ``read_range``: Beam's readers fetch whole buffers (16 MiB on S3 and GCS) or open-ended
  ranges, which costs a whole staging file for one record; this asks for exactly the bytes
  wanted (one ranged GET).
* ``list_one_level``: Beam's FileSystems list a prefix whole, in one call; this lists only what
  is directly under a directory or prefix (a delimiter listing), so that each subdirectory can
  be listed on its own worker.
* ``write_object`` / ``read_object``: Beam's S3 filesystem builds a new boto3 client for every
  call (most of a second each on a busy machine) and renames by copy + delete; these write an
  object with one PUT (or upload), which object stores make visible whole or not at all, so no
  temporary name is needed there.
* ``read_with_retries``: Beam's S3 reads retry a failed request but not a body cut short in
  transit; this runs a whole read through ``objstore``'s retry loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import threading
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

from apache_beam.io.filesystem import CompressionTypes, FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, S3Options

from beam_pipelines.engines import beam_internals
from objstore import (
    RetryPolicy,
    ShortReadError,
    Storage,
    StoreSettings,
    retry_call,
    storage_for,
    temporary_path,
)

__all__ = [
    "create_empty_file",
    "file_digest",
    "list_one_level",
    "read_object",
    "read_range",
    "read_with_retries",
    "storage_settings",
    "write_file",
    "write_object",
]


_COPY_CHUNK = 8 * 1024 * 1024
_OBJSTORE_SCHEMES = (None, "file", "s3", "gs")
# Beam's S3Options flags -> StoreSettings fields (--s3_disable_ssl is the negated s3_use_ssl).
_S3_FLAGS = (
    "s3_endpoint_url",
    "s3_access_key_id",
    "s3_secret_access_key",
    "s3_session_token",
    "s3_region_name",
    "s3_verify",
    "s3_api_version",
)


def storage_settings(options: PipelineOptions | Mapping[str, Any] | None) -> StoreSettings:
    """The ``objstore.StoreSettings`` that Beam's pipeline options give: the ``--s3_*`` flags
    and ``--project``; what they leave unset comes from the environment.

    Args:
      options: ``PipelineOptions``, a dict of option values (as Beam keeps them for
        templates), or None for none.

    Raises:
      ValueError: for a bad value, naming its flag (for example ``--s3_endpoint_url``).
    """
    if options is None:
        return StoreSettings()
    if isinstance(options, PipelineOptions):
        s3 = options.view_as(S3Options)
        values = {name: getattr(s3, name) for name in _S3_FLAGS}
        disable_ssl = bool(s3.s3_disable_ssl)
        project = options.view_as(GoogleCloudOptions).project
    else:
        values = {name: options.get(name) for name in _S3_FLAGS}
        disable_ssl = bool(options.get("s3_disable_ssl"))
        project = options.get("project")
    return StoreSettings(**values, s3_use_ssl=not disable_ssl, gcs_project=project)


_settings_lock = threading.Lock()
_settings_cache: tuple[object, StoreSettings] | None = None


def _settings() -> StoreSettings:
    # Cached per options object: each view_as parses the flags again.
    global _settings_cache
    options = beam_internals.filesystems_options()
    with _settings_lock:
        if _settings_cache is None or _settings_cache[0] is not options:
            _settings_cache = (options, storage_settings(options))
        return _settings_cache[1]


def _storage(path: str, policy: RetryPolicy | None = None) -> Storage | None:
    """objstore's store for ``path`` with the pipeline's settings; None for a scheme only
    Beam's FileSystems serve."""
    if FileSystems.get_scheme(path) not in _OBJSTORE_SCHEMES:
        return None
    return storage_for(path, policy, _settings())


def read_with_retries(
    uri: str, read: Callable[[], bytes], policy: RetryPolicy | None = None
) -> bytes:
    """Runs ``read`` (one whole read of ``uri``), retrying transient storage failures.

    Uses ``objstore.retry_call``: a transient failure is retried with jittered exponential backoff
    up to ``policy.max_attempts`` attempts (``RetryPolicy()`` by default); a permanent failure
    (missing object, 403, a local ``OSError``) is raised at once.

    Raises:
      Exception: the last failure, after the last transient one or at the first permanent.
    """
    return retry_call(read, policy=policy or RetryPolicy(), action="read", uri=uri)


def file_digest(path: str) -> tuple[int, str] | None:
    """``(num_bytes, sha256 hex)`` of a file, streamed; None if it does not exist.

    Raises:
      OSError: from the store (``objstore.ObjectStoreError`` naming the URI), after retries.
    """
    store = _storage(path)
    if store is not None:
        try:
            return store.digest(path)
        except FileNotFoundError:  # objstore's ObjectNotFoundError is one too
            return None
    if not FileSystems.exists(path):
        return None

    def read() -> tuple[int, str]:
        digest = hashlib.sha256()
        size = 0
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            while chunk := handle.read(_COPY_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return size, digest.hexdigest()

    return read_with_retries(path, read)  # type: ignore[arg-type,return-value]


def create_empty_file(path: str) -> None:
    """Creates (or truncates) an empty file: one empty PUT on a bucket.

    Raises:
      OSError: from the store, naming the path.
    """
    store = _storage(path)
    if store is not None:
        store.write_bytes(path, b"")
        return
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED):
        pass


def read_range(path: str, start: int, end: int, policy: RetryPolicy | None = None) -> bytes:
    """Reads bytes ``[start, end)`` of a file, retrying transient failures (a body cut short
    counts as one).

    ``s3://`` and ``gs://`` make one ranged GET, local files one ``pread``; other schemes seek
    and read through ``FileSystems.open``.

    Raises:
      ValueError: if the range is empty or negative, or a local file ends before ``end``.
      OSError: the storage error (``objstore.ObjectStoreError`` on buckets, naming the URI),
        after the last transient failure or at the first permanent.
    """
    if not 0 <= start < end:
        raise ValueError(
            f"byte range must satisfy 0 <= start < end, got [{start}, {end}) of {path}"
        )
    store = _storage(path, policy)
    if store is not None:
        return store.read_range(path, start, end)

    def read() -> bytes:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.seek(start)
            data = handle.read(end - start)
        if len(data) != end - start:
            raise ShortReadError(f"got {len(data)} of {end - start} bytes")
        return data

    return retry_call(
        read, policy=policy or RetryPolicy(), action=f"read bytes [{start}, {end})", uri=path
    )


def write_object(
    path: str,
    data: bytes | None = None,
    *,
    local_path: str | None = None,
    policy: RetryPolicy | None = None,
) -> None:
    """Writes ``data`` (or the file at ``local_path``) as the whole file ``path``, replacing it.

    On ``s3://`` and ``gs://`` one PUT or upload (readers see the whole object or nothing);
    elsewhere under a temporary name, then renamed. Transient failures are retried.

    Raises:
      ValueError: unless exactly one of ``data`` and ``local_path`` is given.
      OSError: the storage error, after the last transient failure or at the first permanent.
    """
    if (data is None) == (local_path is None):
        raise ValueError("write_object needs exactly one of data and local_path")
    store = _storage(path, policy)
    if store is None:
        retry_call(
            lambda: write_file(path, data, local_path=local_path),
            policy=policy or RetryPolicy(),
            action="write",
            uri=path,
        )
    elif data is not None:
        store.write_bytes(path, data)
    else:
        assert local_path is not None  # checked above: exactly one of the two
        store.upload(path, local_path)


def read_object(path: str, policy: RetryPolicy | None = None) -> bytes:
    """Reads a whole (small) file, retrying transient failures.

    Raises:
      OSError: the storage error (a missing file is permanent: a ``FileNotFoundError``).
    """
    store = _storage(path, policy)
    if store is not None:
        return store.read_bytes(path)

    def read() -> bytes:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            return handle.read()

    return retry_call(read, policy=policy or RetryPolicy(), action="read", uri=path)


def write_file(destination: str, data: bytes | None = None, *, local_path: str | None = None):
    """Writes ``data`` (or streams the file at ``local_path``) to any FileSystems path.

    The temporary-name-then-rename helper for the schemes only Beam's FileSystems serve: the
    bytes go under a temporary name next to ``destination`` (``objstore.temporary_path``), then
    are renamed, so nobody listing the directory sees a partial file under the final name.

    Returns:
      ``(num_bytes, sha256 hex)`` of what was written.
    """
    if (data is None) == (local_path is None):
        raise ValueError("write_file needs exactly one of data and local_path")
    temporary = temporary_path(destination)
    digest = hashlib.sha256()
    size = 0
    with contextlib.ExitStack() as stack:
        source: BinaryIO
        if data is not None:
            source = io.BytesIO(data)
        else:
            assert local_path is not None  # checked above: exactly one of the two
            source = stack.enter_context(open(local_path, "rb"))
        chunk = source.read(_COPY_CHUNK)
        if not chunk:
            create_empty_file(temporary)  # Beam's S3 writer cannot make an empty object
        else:
            with FileSystems.create(
                temporary, compression_type=CompressionTypes.UNCOMPRESSED
            ) as sink:
                while chunk:
                    digest.update(chunk)
                    size += len(chunk)
                    sink.write(chunk)
                    chunk = source.read(_COPY_CHUNK)
    try:
        if FileSystems.exists(destination):
            FileSystems.delete([destination])
        FileSystems.rename([temporary], [destination])
    except Exception:
        FileSystems.delete([temporary])
        raise
    return size, digest.hexdigest()


def list_one_level(directory: str) -> tuple[list[str], list[FileMetadata]] | None:
    """What is directly under ``directory``: its subdirectories and its files.

    Local directories are scanned (symbolic links to directories are left out, as Beam's
    recursive listing leaves them); ``s3://`` and ``gs://`` prefixes are listed with a ``/``
    delimiter, page by page (``objstore``'s ``list_one_level``).

    Returns:
      ``(subdirectories, files)``: full paths without a trailing ``/``, sorted, and
      ``FileMetadata`` of the files; None for a scheme without such a listing (the caller
      lists recursively instead).

    Raises:
      OSError: the storage error, after retries (a missing bucket or local directory is a
        ``FileNotFoundError``).
    """
    store = _storage(directory)
    if store is None:
        return None
    dirs, files = store.list_one_level(directory)
    return dirs, [FileMetadata(f.uri, f.size, f.mtime or 0.0) for f in files]
