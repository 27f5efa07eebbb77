"""Object-store corners of Beam FileSystems that the pipeline has to work around.

* Beam's S3 filesystem writes every file as a multipart upload and completes it with no parts
  when the file is empty; S3 (and moto) reject that with ``MalformedXML``. Empty shards and
  empty reports are legitimate, so ``create_empty_file`` writes them with one ``PutObject``,
  through Beam's own S3 client and the options Beam's FileSystems were given (``--s3_*`` flags,
  or else the standard ``AWS_*`` environment, which boto3 reads itself).
* Beam hands its options to FileSystems only when a ``Pipeline`` is built, so a launcher that
  lists or checks ``s3://`` paths before that must call ``FileSystems.set_options`` first.
* Beam's S3 reads retry a failed request but not a body cut short in transit, so
  ``read_with_retries`` runs each whole read through ``objstore``'s retry loop and policy (the
  same as the reader's) before a file is called unreadable.
* Beam's readers fetch whole buffers (16 MiB on S3 and GCS) or open-ended ranges, which costs a
  whole staging file for one record; ``read_range`` asks the store for exactly the bytes wanted
  (one ranged GET), through the same clients and options as Beam's FileSystems.
* Beam's FileSystems list a prefix whole, in one call: ``list_one_level`` lists only what is
  directly under a directory or prefix (a delimiter listing), so that each subdirectory can be
  listed on its own worker.
* Beam's S3 filesystem builds a new boto3 client for every call (most of a second each on a
  busy machine) and renames by copy + delete. ``write_object`` and ``read_object`` use one
  cached client per process and write objects with one PUT (or upload), which object stores
  make visible whole or not at all: no temporary name is needed there. Both retry transient
  failures with ``objstore``'s policy.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

from apache_beam.io.filesystem import CompressionTypes, FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.engines import beam_internals
from objstore import RetryPolicy, ShortReadError, retry_call, temporary_path

__all__ = [
    "create_empty_file",
    "file_digest",
    "list_one_level",
    "read_object",
    "read_range",
    "read_with_retries",
    "write_file",
    "write_object",
]


_COPY_CHUNK = 8 * 1024 * 1024


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
    """``(num_bytes, sha256 hex)`` of a file, streamed; None if it does not exist."""
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
    """Creates (or truncates) an empty file at any Beam FileSystems path.

    Raises:
      OSError / botocore errors: from the filesystem, naming the path.
    """
    if FileSystems.get_scheme(path) != "s3":
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED):
            pass
        return
    from apache_beam.io.aws import s3io

    # The options FileSystems was configured with (set by Beam on every worker); without them
    # boto3 falls back to the AWS environment, as Beam's own client does.
    options = beam_internals.filesystems_options() or PipelineOptions([])
    bucket, key = s3io.parse_s3_path(path)
    s3io.S3IO(options=options).client.client.put_object(Bucket=bucket, Key=key, Body=b"")


_CLIENTS: dict[tuple[Any, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()
# What a client's endpoint depends on besides the pipeline options.
_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "STORAGE_EMULATOR_HOST")


def _options() -> PipelineOptions:
    return beam_internals.filesystems_options() or PipelineOptions([])


def _client(scheme: str) -> Any:
    # One client per process, scheme and configuration: building one costs tens of
    # milliseconds, and both boto3's and google-cloud-storage's clients may be shared between
    # threads.
    options = _options()
    key = (scheme, id(options), *(os.environ.get(v) for v in _ENDPOINT_VARIABLES))
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            if scheme == "s3":
                from apache_beam.io.aws import s3io

                _CLIENTS[key] = s3io.S3IO(options=options).client.client
            else:
                from apache_beam.io.gcp import gcsio

                _CLIENTS[key] = gcsio.GcsIO(pipeline_options=options).client
        return _CLIENTS[key]


def _read_range_once(path: str, start: int, end: int) -> bytes:
    scheme = FileSystems.get_scheme(path)
    if scheme == "s3":
        from apache_beam.io.aws import s3io

        bucket, key = s3io.parse_s3_path(path)
        response = _client("s3").get_object(
            Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}"
        )
        data = response["Body"].read()
    elif scheme == "gs":
        from apache_beam.io.gcp import gcsio

        bucket, key = gcsio.parse_gcs_path(path)
        blob = _client("gs").bucket(bucket).blob(key)
        data = blob.download_as_bytes(start=start, end=end - 1, raw_download=True)
    elif scheme in (None, "file"):
        local = path[len("file://") :] if scheme == "file" else path
        with open(local, "rb") as handle:
            data = os.pread(handle.fileno(), end - start, start)
    else:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            handle.seek(start)
            data = handle.read(end - start)
    if len(data) != end - start:
        raise ShortReadError(f"got {len(data)} of {end - start} bytes")
    return data


def read_range(path: str, start: int, end: int, policy: RetryPolicy | None = None) -> bytes:
    """Reads bytes ``[start, end)`` of a file on any Beam FileSystems path, retrying transient
    failures (a body cut short counts as one).

    ``s3://`` and ``gs://`` make one ranged GET with the clients Beam's FileSystems use (its
    ``--s3_*`` options, or the standard environment); local files one ``pread``; other schemes
    seek and read through ``FileSystems.open``.

    Raises:
      ValueError: if the range is empty or negative.
      Exception: the storage error, after the last transient failure or at the first permanent.
    """
    if not 0 <= start < end:
        raise ValueError(
            f"byte range must satisfy 0 <= start < end, got [{start}, {end}) of {path}"
        )
    return retry_call(
        lambda: _read_range_once(path, start, end),
        policy=policy or RetryPolicy(),
        action=f"read bytes [{start}, {end})",
        uri=path,
    )


def _local_path(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _write_once(path: str, data: bytes | None, local_path: str | None) -> None:
    scheme = FileSystems.get_scheme(path)
    if scheme == "s3":
        from apache_beam.io.aws import s3io

        bucket, key = s3io.parse_s3_path(path)
        if data is not None:
            _client("s3").put_object(Bucket=bucket, Key=key, Body=data)
        else:
            _client("s3").upload_file(local_path, bucket, key)
    elif scheme == "gs":
        from apache_beam.io.gcp import gcsio

        bucket, key = gcsio.parse_gcs_path(path)
        blob = _client("gs").bucket(bucket).blob(key)
        if data is not None:
            blob.upload_from_string(data)
        else:
            blob.upload_from_filename(local_path)
    else:
        write_file(path, data, local_path=local_path)


def write_object(
    path: str,
    data: bytes | None = None,
    *,
    local_path: str | None = None,
    policy: RetryPolicy | None = None,
) -> None:
    """Writes ``data`` (or the file at ``local_path``) as the whole file ``path``, replacing it.

    On ``s3://`` and ``gs://`` one PUT or upload with a cached client (readers see the whole
    object or nothing); elsewhere under a temporary name, then renamed. Transient failures are
    retried.

    Raises:
      ValueError: unless exactly one of ``data`` and ``local_path`` is given.
      Exception: the storage error, after the last transient failure or at the first permanent.
    """
    if (data is None) == (local_path is None):
        raise ValueError("write_object needs exactly one of data and local_path")
    retry_call(
        lambda: _write_once(path, data, local_path),
        policy=policy or RetryPolicy(),
        action="write",
        uri=path,
    )


def _read_once(path: str) -> bytes:
    scheme = FileSystems.get_scheme(path)
    if scheme == "s3":
        from apache_beam.io.aws import s3io

        bucket, key = s3io.parse_s3_path(path)
        return _client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    if scheme == "gs":
        from apache_beam.io.gcp import gcsio

        bucket, key = gcsio.parse_gcs_path(path)
        return _client("gs").bucket(bucket).blob(key).download_as_bytes(raw_download=True)
    if scheme in (None, "file"):
        with open(_local_path(path), "rb") as handle:
            return handle.read()
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


def read_object(path: str, policy: RetryPolicy | None = None) -> bytes:
    """Reads a whole (small) file with a cached client, retrying transient failures.

    Raises:
      Exception: the storage error (a missing file is permanent).
    """
    return retry_call(
        lambda: _read_once(path), policy=policy or RetryPolicy(), action="read", uri=path
    )


def write_file(destination: str, data: bytes | None = None, *, local_path: str | None = None):
    """Writes ``data`` (or streams the file at ``local_path``) to any FileSystems path.

    The one temporary-name-then-rename helper of the pipeline: the bytes go under a temporary
    name next to ``destination`` (``objstore.temporary_path``), then are renamed, so nobody
    listing the directory sees a partial file under the final name.

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
    delimiter, page by page.

    Returns:
      ``(subdirectories, files)``: full paths without a trailing ``/``, sorted, and
      ``FileMetadata`` of the files; None for a scheme without such a listing (the caller
      lists recursively instead).

    Raises:
      Exception: the storage error, after retries.
    """
    scheme = FileSystems.get_scheme(directory)
    root = directory.rstrip("/")
    if scheme in (None, "file"):
        dirs, files = [], []
        with os.scandir(_local_path(root)) as entries:
            for entry in entries:
                path = FileSystems.join(root, entry.name)
                if entry.is_dir(follow_symlinks=False):
                    dirs.append(path)
                elif entry.is_file():
                    info = entry.stat()
                    files.append(FileMetadata(path, info.st_size, info.st_mtime))
        return sorted(dirs), sorted(files, key=lambda m: m.path)
    if scheme not in ("s3", "gs"):
        return None

    def listing() -> tuple[list[str], list[FileMetadata]]:
        dirs: list[str] = []
        files: list[FileMetadata] = []
        bucket, _, key = root[len(scheme) + 3 :].partition("/")
        prefix = f"{key}/" if key else ""
        base = f"{scheme}://{bucket}/"
        if scheme == "s3":
            pages = _client("s3").get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
                dirs += [base + p["Prefix"].rstrip("/") for p in page.get("CommonPrefixes", ())]
                files += [
                    FileMetadata(base + o["Key"], o["Size"], o["LastModified"].timestamp())
                    for o in page.get("Contents", ())
                    if o["Key"] != prefix
                ]
        else:
            blobs = _client("gs").list_blobs(bucket, prefix=prefix, delimiter="/")
            for page in blobs.pages:
                files += [
                    FileMetadata(base + b.name, b.size, b.updated.timestamp() if b.updated else 0)
                    for b in page
                    if b.name != prefix
                ]
                dirs += [base + p.rstrip("/") for p in page.prefixes]
        return sorted(set(dirs)), sorted(files, key=lambda m: m.path)

    return retry_call(listing, policy=RetryPolicy(), action="list", uri=directory)
