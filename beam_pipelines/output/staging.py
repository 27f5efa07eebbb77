"""The build's staging area for prepared examples: written once by the image step, read back
in key order by the shard writer.

Why: Beam runners hold whatever crosses a shuffle in memory (the in-process DirectRunner every
element of it, several times over), so moving each example's bytes through the group-by-shard
made memory grow with the dataset. Here the bytes cross no shuffle at all:

* the image step appends each example, TFRecord-framed (the bytes a shard holds), to a local
  file (``RecordStager``). When the file reaches ``max_file_bytes``, or ``max_file_seconds``
  after its first record, or the bundle ends, the file is committed to
  ``DST/.staging/records/<uuid>.tfrecord`` (uploaded in one request on buckets, which makes an
  object visible whole or not at all; written in place and renamed locally) and only then are its
  records' ``StagedRecord`` locations emitted. A sidecar ``<uuid>.json`` listing those
  locations is written after the file: ``--resume`` reuses a committed file's examples instead
  of preparing them again.
* the shard writer reads each frame back by ``(file, offset, length)`` in key order
  (``StagedRecordReader``), checking its length and CRCs, with a bounded read-ahead: ranged
  reads on a thread pool for buckets, ``pread`` for local files.

A frame does not depend on where it sits in a file, so a shard assembled from staged frames is
byte-identical to one framed directly. The whole ``DST/.staging/`` is removed after publishing
and kept after a failure.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import pickle
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_pipelines.elements import CatalogMeta, StagedRecord
from beam_pipelines.engines.filesystems import read_object, read_range, write_object
from beam_pipelines.output.catalog_io import STAGING_DIR
from objstore import temporary_path
from schemas.framing import frame_pieces, payload_of_frame

__all__ = [
    "RECORDS_DIR",
    "DEFAULT_FILE_BYTES",
    "DEFAULT_FILE_SECONDS",
    "DEFAULT_READ_AHEAD_BYTES",
    "staging_dir",
    "records_dir",
    "is_local",
    "RecordStager",
    "StagedRecordReader",
    "pack_locations",
    "unpack_locations",
    "sidecar_name",
    "list_sidecars",
    "read_sidecar",
]

RECORDS_DIR = "records"
# A committed staging file is the unit --resume can reuse: small enough that a kill loses
# little work, large enough that a bucket sees few objects (32 MiB of 110 KB examples is ~300).
DEFAULT_FILE_BYTES = 32 * 1024 * 1024
DEFAULT_FILE_SECONDS = 10.0
# What the shard writer may have requested but not yet written, per shard being assembled.
DEFAULT_READ_AHEAD_BYTES = 32 * 1024 * 1024
_READ_THREADS = 8
_OPEN_FILES = 64
_SUFFIX = ".tfrecord"
_SIDECAR_SUFFIX = ".json"


def staging_dir(output_dir: str) -> str:
    """``DST/.staging``: the build's durable working area."""
    return FileSystems.join(output_dir, STAGING_DIR)


def records_dir(output_dir: str) -> str:
    """``DST/.staging/records``: where the image step stages prepared examples."""
    return FileSystems.join(output_dir, STAGING_DIR, RECORDS_DIR)


def is_local(path: str) -> bool:
    """True for a local path (no scheme, or ``file://``)."""
    return FileSystems.get_scheme(path) in (None, "file")


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def sidecar_name(file: str) -> str:
    """The name of the sidecar listing the records of staging file ``file``."""
    return file[: -len(_SUFFIX)] + _SIDECAR_SUFFIX


def _meta_to_json(meta: CatalogMeta | None) -> dict[str, Any] | None:
    return None if meta is None else meta._asdict()


def _meta_from_json(data: dict[str, Any] | None) -> CatalogMeta | None:
    if data is None:
        return None
    meta = CatalogMeta(**data)
    windows = meta.window_phash  # a JSON list: the tuple CatalogMeta holds
    return meta if windows is None else meta._replace(window_phash=tuple(windows))


class RecordStager:
    """Appends framed examples to a local file and commits it to the staging area.

    ``add`` and ``flush`` return the ``StagedRecord`` locations of the records in the file they
    committed (none until a file is committed): a location is handed out only once the bytes it
    points at are durable. One stager per DoFn instance; not thread-safe.

    Args:
      output_dir: the dataset directory (any Beam FileSystems path).
      max_file_bytes: commit the file once it holds this many bytes.
      max_file_seconds: commit the file this long after its first record, so that a slow or
        killed build loses little finished work.
      clock: returns seconds (tests pass a fake one).
      finalize: completes the locations of a committed file before they are recorded in its
        sidecar and handed out (the image step fills in catalog columns computed per file,
        such as perceptual hashes): a resumed build reuses them exactly as they were emitted.
    """

    def __init__(
        self,
        output_dir: str,
        *,
        max_file_bytes: int = DEFAULT_FILE_BYTES,
        max_file_seconds: float = DEFAULT_FILE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        finalize: Callable[[list[StagedRecord]], list[StagedRecord]] | None = None,
    ) -> None:
        if max_file_bytes < 1 or max_file_seconds <= 0:
            raise ValueError(
                f"max_file_bytes ({max_file_bytes}) and max_file_seconds ({max_file_seconds}) "
                "must be positive"
            )
        self._dir = records_dir(output_dir)
        self._local_output = is_local(output_dir)
        self._max_bytes = max_file_bytes
        self._max_seconds = max_file_seconds
        self._clock = clock
        self._finalize = finalize
        self._handle: Any = None
        self._local_path = ""
        self._name = ""
        self._started = 0.0
        self._offset = 0
        self._pending: list[StagedRecord] = []

    def _open(self) -> None:
        self._name = uuid.uuid4().hex + _SUFFIX
        if self._local_output:
            # Written in place under a hidden temporary name, renamed when committed: the same
            # guarantee as a copy, without copying every byte once more.
            directory = _local(self._dir)
            os.makedirs(directory, exist_ok=True)
            self._local_path = temporary_path(os.path.join(directory, self._name))
            self._handle = open(self._local_path, "wb")  # closed in flush or close
        else:
            fd, self._local_path = tempfile.mkstemp(prefix="staging-", suffix=_SUFFIX)
            self._handle = os.fdopen(fd, "wb")
        self._started = self._clock()
        self._offset = 0

    def add(
        self, sha256: str, uri: str, payload: bytes, meta: CatalogMeta | None
    ) -> list[StagedRecord]:
        """Appends one serialized example; returns the locations of a file it committed."""
        if self._handle is None:
            self._open()
        header, footer = frame_pieces(payload)
        self._handle.write(header)
        self._handle.write(payload)
        self._handle.write(footer)
        length = len(header) + len(payload) + len(footer)
        self._pending.append(StagedRecord(sha256, uri, self._name, self._offset, length, meta))
        self._offset += length
        if self._offset >= self._max_bytes or self._clock() - self._started >= self._max_seconds:
            return self.flush()
        return []

    def flush(self) -> list[StagedRecord]:
        """Commits the open file, if any; returns its records' locations."""
        if self._handle is None:
            return []
        self._handle.close()
        self._handle = None
        destination = FileSystems.join(self._dir, self._name)
        try:
            if self._local_output:
                os.replace(self._local_path, _local(destination))
            else:
                write_object(destination, local_path=self._local_path)
        finally:
            if os.path.exists(self._local_path):
                os.remove(self._local_path)
        committed, self._pending = self._pending, []
        if self._finalize is not None:
            committed = list(self._finalize(committed))
        # After the file: a sidecar that exists always describes a complete file.
        sidecar = {
            "file": self._name,
            "num_bytes": self._offset,
            "records": [
                [r.sha256, r.uri, r.offset, r.length, _meta_to_json(r.meta)] for r in committed
            ],
        }
        write_object(
            FileSystems.join(self._dir, sidecar_name(self._name)),
            json.dumps(sidecar, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
        )
        return committed

    def close(self) -> None:
        """Drops an uncommitted file (after a failure); its records were never handed out."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            if os.path.exists(self._local_path):
                os.remove(self._local_path)
        self._pending = []


def list_sidecars(output_dir: str) -> list[str]:
    """The sidecars of every committed staging file in ``output_dir``'s staging area, sorted."""
    pattern = FileSystems.join(records_dir(output_dir), "*" + _SIDECAR_SUFFIX)
    try:
        matched = FileSystems.match([pattern])[0].metadata_list
    except Exception:  # each FileSystem reports "nothing there" its own way
        return []
    return sorted(m.path for m in matched)


def read_sidecar(path: str) -> list[StagedRecord]:
    """The locations a sidecar lists, once its staging file is checked to be whole.

    Returns:
      The staged records, or an empty list if the staging file is missing or not the size the
      sidecar records (it is then not reused).
    """
    data = json.loads(read_object(path).decode("utf-8"))
    directory = FileSystems.split(path)[0]
    try:
        found = FileSystems.match([FileSystems.join(directory, data["file"])])[0].metadata_list
    except Exception:
        found = []
    if len(found) != 1 or found[0].size_in_bytes != data["num_bytes"]:
        return []
    file = data["file"]
    return [
        StagedRecord(sha, uri, file, offset, length, _meta_from_json(meta))
        for sha, uri, offset, length, meta in data["records"]
    ]


def _where(record: StagedRecord) -> str:
    return f"staged example of {record.uri} ({record.file} at byte {record.offset})"


class StagedRecordReader:
    """Reads staged frames back, in the order asked, with a bounded read-ahead.

    Local staging is read with ``pread`` on a small cache of open files (the page cache does
    the rest); buckets with ranged reads, ``threads`` at a time, never more than
    ``read_ahead_bytes`` requested ahead of the record being written. Every frame's length and
    CRCs are checked.

    Args:
      output_dir: the dataset directory whose staging area holds the files.
      read_ahead_bytes: the most bytes requested but not yet consumed (at least one frame).
      threads: parallel ranged reads on buckets.
    """

    def __init__(
        self,
        output_dir: str,
        *,
        read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES,
        threads: int = _READ_THREADS,
    ) -> None:
        self._dir = records_dir(output_dir)
        self._local = is_local(output_dir)
        self._read_ahead = read_ahead_bytes
        self._threads = threads
        self._fds: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _path(self, file: str) -> str:
        # A name in the staging area, or (an example an incremental build takes from its base
        # where it lies, ``base.BaseDataset.locate``) an absolute path or URI.
        if "://" in file or os.path.isabs(file):
            return file
        return FileSystems.join(self._dir, file)

    def _fd(self, file: str) -> int:
        fd = self._fds.pop(file, None)
        if fd is None:
            fd = os.open(_local(self._path(file)), os.O_RDONLY)
            if len(self._fds) >= _OPEN_FILES:
                os.close(self._fds.popitem(last=False)[1])
        self._fds[file] = fd
        return fd

    def _read_local(self, record: StagedRecord) -> bytes:
        if not is_local(self._path(record.file)):
            return self._read_remote(record)
        data = os.pread(self._fd(record.file), record.length, record.offset)
        if len(data) != record.length:
            raise ValueError(
                f"staging file {record.file} ends before the frame of {record.uri} "
                f"[{record.offset}, {record.offset + record.length})"
            )
        return data

    def _read_remote(self, record: StagedRecord) -> bytes:
        path = self._path(record.file)
        return read_range(path, record.offset, record.offset + record.length)

    def frames(self, records: Iterable[StagedRecord]) -> Iterator[bytes]:
        """Yields each record's whole frame, checked, in the order of ``records``.

        Raises:
          ValueError: if a frame is cut short or fails its CRC check, naming the source URI.
          Exception: a storage error, after retries.
        """
        if self._local:
            for record in records:
                frame = self._read_local(record)
                payload_of_frame(frame, _where(record))
                yield frame
            return
        yield from self._frames_remote(records)

    def _frames_remote(self, records: Iterable[StagedRecord]) -> Iterator[bytes]:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="staged-read"
            )
        window: collections.deque[tuple[StagedRecord, concurrent.futures.Future[bytes]]]
        window = collections.deque()
        in_flight = 0
        pending = iter(records)
        exhausted = False
        try:
            while True:
                while not exhausted and (not window or in_flight < self._read_ahead):
                    record = next(pending, None)
                    if record is None:
                        exhausted = True
                        break
                    window.append((record, self._pool.submit(self._read_remote, record)))
                    in_flight += record.length
                if not window:
                    return
                record, future = window.popleft()
                frame = future.result()
                in_flight -= record.length
                payload_of_frame(frame, _where(record))
                yield frame
        finally:
            for _, future in window:
                future.cancel()

    def close(self) -> None:
        """Closes open files and stops the read threads."""
        while self._fds:
            os.close(self._fds.popitem()[1])
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def pack_locations(records: Iterable[StagedRecord]) -> bytes:
    """Many locations as one compact value: what crosses the group-by-shard.

    Beam's in-process runner keeps every element of a shuffle as a Python object (about 1 KB
    for one ``StagedRecord``, its strings and its ``CatalogMeta``) plus its encoding. Packed by
    the thousand (plain tuples, the key as 32 raw bytes, pickled, zlib level 1: URIs and class
    names repeat), a location costs about 60 bytes there.
    """
    rows = [
        (
            bytes.fromhex(r.sha256),
            r.uri,
            r.file,
            r.offset,
            r.length,
            None if r.meta is None else tuple(r.meta),
        )
        for r in records
    ]
    return zlib.compress(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL), 1)


def unpack_locations(data: bytes) -> list[StagedRecord]:
    """The locations ``pack_locations`` packed, in order."""
    return [
        StagedRecord(key.hex(), uri, file, offset, length, None if m is None else CatalogMeta(*m))
        for key, uri, file, offset, length, m in pickle.loads(zlib.decompress(data))
    ]
