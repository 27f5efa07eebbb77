"""Per-shard index files: one line ``"<offset> <length>\\n"`` per record.

This is the format NVIDIA DALI's ``tfrecord2idx`` writes and both DALI's
``fn.readers.tfrecord(index_path=...)`` and the ``tfrecord`` package
(``index_pattern=...``) read. ``offset`` is the byte position of a record's frame (its 8-byte
length field); ``length`` is the whole frame: 8 (length) + 4 (length CRC) + payload + 4 (payload
CRC). Records of a TFRecord file are contiguous, so every offset is the sum of the lengths before
it and a writer knows the index as it writes, without a second scan.

An index file is named after its shard with the TFRecord extension replaced:
``train-00003-of-00016.tfrecord`` -> ``train-00003-of-00016.idx`` (a shard without one, such as
TensorFlow's converters' ``train-00003-of-01024``, gets ``.idx`` appended).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from schemas.framing import FRAME_OVERHEAD, frame_length

__all__ = [
    "INDEX_SUFFIX",
    "index_filename",
    "entries_from_payload_sizes",
    "format_index",
    "parse_index",
    "check_contiguous",
]

INDEX_SUFFIX = ".idx"
_TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec")


def index_filename(shard_name: str) -> str:
    """The index file name for a shard file name (no directory): same stem, ``.idx``.

    Raises:
      ValueError: if ``shard_name`` is empty or holds a ``/``.
    """
    if not shard_name or "/" in shard_name:
        raise ValueError(f"expected a shard file name without directory, got {shard_name!r}")
    for suffix in _TFRECORD_SUFFIXES:
        if shard_name.endswith(suffix) and len(shard_name) > len(suffix):
            return shard_name[: -len(suffix)] + INDEX_SUFFIX
    return shard_name + INDEX_SUFFIX


def entries_from_payload_sizes(payload_sizes: Iterable[int]) -> np.ndarray:
    """``(n, 2)`` int64 ``[offset, length]`` rows for records of the given payload sizes."""
    lengths = np.fromiter((frame_length(s) for s in payload_sizes), dtype=np.int64)
    offsets = np.zeros_like(lengths)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], out=offsets[1:])
    return np.stack([offsets, lengths], axis=1) if len(lengths) else np.zeros((0, 2), np.int64)


def format_index(entries: Iterable[tuple[int, int]] | np.ndarray) -> bytes:
    """The bytes of an index file: ``"<offset> <length>\\n"`` per record, ASCII decimal."""
    return "".join(f"{int(offset)} {int(length)}\n" for offset, length in entries).encode("ascii")


def parse_index(data: bytes, *, name: str = "index file") -> np.ndarray:
    """Parses an index file into ``(n, 2)`` int64 ``[offset, length]`` rows.

    Args:
      data: the file's bytes.
      name: what to call the file in errors (its path).

    Raises:
      ValueError: naming the file and the first bad line (not two non-negative integers,
        a missing final newline, a length shorter than a frame).
    """
    if data and not data.endswith(b"\n"):
        raise ValueError(f"{name}: truncated (the last line has no newline)")
    lines = data.split(b"\n")[:-1] if data else []
    rows = np.empty((len(lines), 2), dtype=np.int64)
    for i, line in enumerate(lines):
        parts = line.split(b" ")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(
                f"{name}: line {i + 1} is {line[:60]!r}, expected '<offset> <length>' "
                "(two non-negative integers)"
            )
        offset, length = int(parts[0]), int(parts[1])
        if length < FRAME_OVERHEAD:
            raise ValueError(
                f"{name}: line {i + 1} gives length {length}, shorter than a record frame "
                f"({FRAME_OVERHEAD} bytes)"
            )
        rows[i] = offset, length
    return rows


def check_contiguous(entries: np.ndarray, file_size: int, *, name: str = "index file") -> None:
    """Checks that index rows tile a shard of ``file_size`` bytes exactly, from byte 0.

    Raises:
      ValueError: naming the file, the first row that does not start where the previous ended,
        or the end that does not match the file size.
    """
    position = 0
    for i, (offset, length) in enumerate(entries):
        if int(offset) != position:
            raise ValueError(
                f"{name}: record {i} starts at byte {int(offset)}, expected {position} "
                "(the end of the previous record)"
            )
        position += int(length)
    if position != file_size:
        raise ValueError(
            f"{name}: records end at byte {position}, but the shard has {file_size} bytes"
        )
