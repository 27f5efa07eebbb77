"""Reading examples of a split by global index, without TensorFlow.

``SplitFiles`` is what a dataset object carries to its DataLoader workers (plain, picklable
data from ``dataset.json``); ``RecordReader`` is what each worker builds from it to read
records: ``os.pread`` of each record's frame from the shard file, its length and data CRCs
checked (``schemas.framing``), then the example's few features parsed.

* **Offsets** come from a local shard's index file when ``dataset.json`` lists one (one
  ``"<offset> <length>"`` line per record, checked to tile the shard), else from one scan of
  the shard's record headers (always for bucket shards, whose local copy was just written).
  A reader keeps the offsets of the shards it read last.
* **Local shards** are opened directly; a shard whose size is not its committed size, or whose
  record count differs from ``dataset.json``, fails naming it.
* **Bucket shards** (``s3://``, ``gs://``) come through the host's shard cache
  (``tfrecord_io.cache``): a worker asks the cache's owner process for each shard through the
  cache directory and opens the verified local copy (SHA-256 checked against
  ``dataset.json``); the shards of the next window are announced ahead.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import struct
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from catalog.index_files import check_contiguous, parse_index
from objstore import storage_for
from schemas import KEY_ENCODED, KEY_LABEL, KEY_SHA256, Manifest
from schemas.example_proto import Example
from schemas.framing import FRAME_OVERHEAD, FrameError, masked_crc32c, payload_of_frame
from tfrecord_io.source import (
    is_remote,
    join,
    load_manifest,
    local_path,
    manifest_path,
    object_store_for,
)
from tfrecord_io.torch.example_fields import ParsedFields, read_fields

__all__ = ["ExampleFields", "RecordReader", "SplitFiles", "load_split", "scan_offsets"]

_HEADER = struct.Struct("<QI")  # a frame's payload length and its masked CRC
_PAYLOAD_START = _HEADER.size
_FOOTER = FRAME_OVERHEAD - _HEADER.size  # the payload's masked CRC
# Shards whose files and offsets a reader keeps open: two windows' worth, at least.
_MIN_OPEN_SHARDS = 16


@dataclasses.dataclass(frozen=True)
class SplitFiles:
    """A split's shard files, as ``dataset.json`` commits them.

    Attributes:
      source: the dataset as given (for messages and the default cache directory).
      root: where ``dataset.json`` is (index files are relative to it).
      shard_root: where the shards are.
      split: the split's name.
      files, counts, sizes, sha256: per shard, in file order.
      index_files: per shard, its index file relative to ``root``, or "" when it has none.
      remote: the shards are in a bucket (read through the shard cache).
    """

    source: str
    root: str
    shard_root: str
    split: str
    files: tuple[str, ...]
    counts: tuple[int, ...]
    sizes: tuple[int, ...]
    sha256: tuple[str, ...]
    index_files: tuple[str, ...]
    remote: bool

    def path(self, shard: int) -> str:
        return join(self.shard_root, self.files[shard])

    @property
    def num_examples(self) -> int:
        return sum(self.counts)

    def index_path(self, shard: int) -> str:
        return join(self.root, self.index_files[shard])


class ExampleFields(NamedTuple):
    """The fields of one example a batch needs: its stored image (a view of the record read,
    or bytes), its label and its key ("" unless asked for)."""

    encoded: memoryview | bytes
    label: int
    key: str


def load_split(source: str | os.PathLike[str], split: str) -> tuple[SplitFiles, Manifest]:
    """The shard files of ``split`` of the dataset at ``source`` (its root, ``dataset.json``, or
    a ``latest`` pointer), and the manifest.

    Raises:
      FileNotFoundError: if ``source`` holds no ``dataset.json``, naming it.
      KeyError: if the manifest has no such split (naming the splits it has).
      ValueError: if the split holds no example.
    """
    text = os.fspath(source)
    path = manifest_path(text)
    manifest = None if path is None else load_manifest(path)
    if manifest is None or path is None:
        raise FileNotFoundError(
            f"{text} has no dataset.json: the torch loader reads datasets written by "
            "beam_pipelines.images_to_tfrecord (shards of other tools: adopt them first with "
            "python -m dataset_tools.adopt)"
        )
    root = posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)
    root = root or "."
    info = manifest.split(split)
    if not info.num_examples:
        raise ValueError(f"split {split!r} of {text} holds no example")
    shards = list(info.shards)
    files = SplitFiles(
        source=text,
        root=root,
        shard_root=manifest.shard_root or root,
        split=split,
        files=tuple(s.file for s in shards),
        counts=tuple(s.num_examples for s in shards),
        sizes=tuple(s.num_bytes for s in shards),
        sha256=tuple(s.sha256 for s in shards),
        index_files=tuple(s.index.file if s.index is not None else "" for s in shards),
        remote=object_store_for(manifest.shard_root or root) is not None,
    )
    return files, manifest


def parse_example(payload: bytes | memoryview, *, with_key: bool) -> ParsedFields:
    """Parses the features the loader needs from a serialised ``tf.train.Example`` with
    protobuf: ``(image bytes, label, key)``.

    Raises:
      ValueError: if the message cannot be parsed or lacks the image or the label.
    """
    try:
        example = Example.FromString(payload)
        feature = example.features.feature
        encoded = feature[KEY_ENCODED].bytes_list.value
        label = feature[KEY_LABEL].int64_list.value
    except Exception as e:  # protobuf's DecodeError and friends
        raise ValueError(f"not a tf.train.Example ({e})") from e
    if len(encoded) != 1 or len(label) != 1:
        raise ValueError(
            f"expected one {KEY_ENCODED!r} and one {KEY_LABEL!r}, got "
            f"{len(encoded)} and {len(label)}"
        )
    key = ""
    if with_key and KEY_SHA256 in feature:
        values = feature[KEY_SHA256].bytes_list.value
        key = values[0].decode() if values else ""
    return encoded[0], int(label[0]), key


class _OpenShard:
    """One shard open for reading: its file and the offsets and lengths of its records."""

    def __init__(self, handle: BinaryIO, offsets: np.ndarray, lengths: np.ndarray) -> None:
        self.handle = handle
        self.fd = handle.fileno()
        self.offsets = offsets
        self.lengths = lengths


class RecordReader:
    """Reads examples of one split by (shard, record), in one process.

    Args:
      files: the split.
      cache: the host's shard cache client for bucket shards (None for local shards).
      open_shards: shards kept open with their offsets.
    """

    def __init__(self, files: SplitFiles, cache: Any = None, *, open_shards: int = 32) -> None:
        if files.remote and cache is None:
            raise ValueError(f"{files.source}: a bucket split needs a shard cache client")
        self.files = files
        self._cache = cache
        self._open: OrderedDict[int, _OpenShard] = OrderedDict()
        self._capacity = max(_MIN_OPEN_SHARDS, open_shards)

    def close(self) -> None:
        while self._open:
            _, shard = self._open.popitem()
            shard.handle.close()

    def announce(self, shards: Sequence[int] | np.ndarray) -> None:
        """Asks the shard cache to download these shards ahead (bucket splits only)."""
        if self._cache is not None:
            self._cache.announce([self.files.path(int(s)) for s in shards])

    def read(self, shard: int, record: int, *, with_key: bool = False) -> ExampleFields:
        """The example at ``record`` of ``shard``, its frame's CRCs checked.

        Raises:
          ValueError: naming the shard and byte offset, if the frame is damaged or not an
            example; or if the shard's size or record count is not the committed one.
          FileNotFoundError: if a local shard is missing.
        """
        opened = self._shard(shard)
        offset, length = int(opened.offsets[record]), int(opened.lengths[record])
        frame = os.pread(opened.fd, length, offset)
        try:
            if len(frame) != length:
                raise FrameError("the file ends inside the record (damaged shard)")
            payload_of_frame(frame)  # checks the length and both CRCs
            end = len(frame) - _FOOTER
            return ExampleFields(
                *read_fields(frame, _PAYLOAD_START, end, with_key=with_key, parse=parse_example)
            )
        except (FrameError, ValueError) as e:
            where = f"{self.files.path(shard)}: record {record} at byte {offset}"
            raise ValueError(f"{where}: {e}") from e

    def _shard(self, shard: int) -> _OpenShard:
        opened = self._open.get(shard)
        if opened is not None:
            self._open.move_to_end(shard)
            return opened
        handle = self._open_file(shard)
        try:
            offsets, lengths = self._offsets(shard, handle)
        except BaseException:
            handle.close()
            raise
        opened = _OpenShard(handle, offsets, lengths)
        self._open[shard] = opened
        while len(self._open) > self._capacity:
            _, old = self._open.popitem(last=False)
            old.handle.close()
        return opened

    def _open_file(self, shard: int) -> BinaryIO:
        path = self.files.path(shard)
        if self._cache is not None:
            return self._cache.open(path)
        try:
            handle = open(local_path(path), "rb")
        except FileNotFoundError as e:
            raise FileNotFoundError(f"shard {path} listed in dataset.json is missing") from e
        size = os.fstat(handle.fileno()).st_size
        if size != self.files.sizes[shard]:
            handle.close()
            raise ValueError(
                f"shard {path} holds {size} bytes, but dataset.json commits "
                f"{self.files.sizes[shard]} (a damaged or rewritten shard)"
            )
        return handle

    def _offsets(self, shard: int, handle: BinaryIO) -> tuple[np.ndarray, np.ndarray]:
        expected = self.files.counts[shard]
        size = self.files.sizes[shard]
        name = self.files.path(shard)
        # A bucket shard is a verified local copy by now: its headers are read from the page
        # cache, which spares the workers a client of the object store (whose clients do not
        # survive the DataLoader's fork) and a request per shard.
        if self.files.index_files[shard] and self._cache is None:
            index_path = self.files.index_path(shard)
            entries = parse_index(_read_small(index_path), name=f"index file {index_path}")
            check_contiguous(entries, size, name=f"index of {name}")
            offsets, lengths = entries[:, 0], entries[:, 1]
        else:
            offsets, lengths = scan_offsets(handle.fileno(), size, name=name)
        if offsets.size != expected:
            raise ValueError(
                f"shard {name} holds {offsets.size} records, but dataset.json commits {expected}"
            )
        return offsets, lengths


def scan_offsets(fd: int, size: int, *, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The offsets and frame lengths of every record of a TFRecord file, from its headers.

    Raises:
      ValueError: naming the file and byte offset, if a header is damaged or the last record
        runs past the end of the file.
    """
    offsets, lengths = [], []
    position = 0
    while position < size:
        header = os.pread(fd, _HEADER.size, position)
        if len(header) < _HEADER.size:
            raise ValueError(f"{name}: truncated inside the record header at byte {position}")
        length, crc = _HEADER.unpack(header)
        if masked_crc32c(header[:8]) != crc:
            raise ValueError(f"{name}: the record header at byte {position} is damaged")
        frame = length + FRAME_OVERHEAD
        if position + frame > size:
            raise ValueError(f"{name}: the record at byte {position} runs past the end of the file")
        offsets.append(position)
        lengths.append(frame)
        position += frame
    return np.asarray(offsets, np.int64), np.asarray(lengths, np.int64)


def _read_small(path: str) -> bytes:
    # Local paths, s3:// and gs:// (any other scheme is a ValueError naming those).
    return storage_for(path).read_bytes(path)
