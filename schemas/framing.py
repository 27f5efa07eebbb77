"""TFRecord framing, the one copy: frames written and read in Python, CRCs computed in C
(``google_crc32c``), with neither TensorFlow nor Beam.

A frame is ``length`` (8 bytes, little-endian) + masked CRC-32C of those 8 bytes + ``length``
bytes of payload + masked CRC-32C of the payload: the bytes ``tf.io.TFRecordWriter`` writes.
Writing and reading frames here (rather than through ``tf.data``) gives each record's byte
offset, which is what index files and catalogs record, lets a single record be checked from a
ranged read of its bytes alone, and lets pipeline workers write shards without TensorFlow.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

import google_crc32c

__all__ = [
    "FRAME_OVERHEAD",
    "FrameError",
    "Frame",
    "frame_length",
    "frame_pieces",
    "masked_crc32c",
    "payload_of_frame",
    "parse_frame",
    "iter_frames",
    "write_frame",
]

_HEADER = 12  # the length (8 bytes) and its masked CRC (4)
_FOOTER = 4  # the payload's masked CRC
# The bytes a frame adds to its payload.
FRAME_OVERHEAD = _HEADER + _FOOTER
_MASK_DELTA = 0xA282EAD8
_READ_CHUNK = 4 * 1024 * 1024


class FrameError(ValueError):
    """A damaged or truncated frame: the message names the file and the byte offset."""


class Frame(NamedTuple):
    """One record: where its frame starts, the frame's whole length, and its payload."""

    offset: int
    length: int
    payload: bytes


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_length(payload_size: int) -> int:
    """The bytes one record of ``payload_size`` bytes takes in a TFRecord file."""
    return FRAME_OVERHEAD + payload_size


def frame_pieces(payload: bytes) -> tuple[bytes, bytes]:
    """The frame around ``payload``: ``(header, footer)``.

    ``header + payload + footer`` are the bytes ``tf.io.TFRecordWriter`` writes; returned apart
    so that the payload is not copied.
    """
    length = struct.pack("<Q", len(payload))
    return (
        length + struct.pack("<I", masked_crc32c(length)),
        struct.pack("<I", masked_crc32c(payload)),
    )


def write_frame(stream: BinaryIO, payload: bytes) -> int:
    """Writes one record's frame to ``stream``; returns the frame's length in bytes."""
    header, footer = frame_pieces(payload)
    stream.write(header)
    stream.write(payload)
    stream.write(footer)
    return frame_length(len(payload))


def _payload_length(header: bytes, where: str) -> int:
    (length,) = struct.unpack("<Q", header[:8])
    (crc,) = struct.unpack("<I", header[8:12])
    if masked_crc32c(header[:8]) != crc:
        raise FrameError(f"{where}: length CRC mismatch (not a record boundary, or damaged)")
    return length


def payload_of_frame(frame: bytes, where: str = "frame") -> memoryview:
    """Checks one whole frame (length, both CRCs) and returns its payload, without a copy.

    Raises:
      FrameError: naming ``where``, if the bytes are not exactly one intact frame.
    """
    if len(frame) < FRAME_OVERHEAD:
        raise FrameError(f"{where}: {len(frame)} bytes is shorter than a record frame")
    length = _payload_length(frame[:_HEADER], where)
    if frame_length(length) != len(frame):
        raise FrameError(
            f"{where}: the frame says {length} payload bytes ({frame_length(length)} in "
            f"all) but the range holds {len(frame)}"
        )
    (crc,) = struct.unpack_from("<I", frame, _HEADER + length)
    # The CRC function takes bytes only: one copy of the payload, about 10 us per 100 KB.
    if masked_crc32c(frame[_HEADER : _HEADER + length]) != crc:
        raise FrameError(f"{where}: data CRC mismatch (the record is damaged)")
    return memoryview(frame)[_HEADER : _HEADER + length]


def parse_frame(data: bytes, *, name: str = "record", offset: int = 0) -> bytes:
    """Checks one whole frame (as read from a byte range of file ``name`` at ``offset``) and
    returns its payload.

    Raises:
      FrameError: naming ``name`` and ``offset`` if the bytes are not exactly one intact frame.
    """
    return bytes(payload_of_frame(data, f"{name} at byte {offset}"))


class _Reader:
    """Reads exactly n bytes at a time from a stream, feeding every byte to a SHA-256."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.digest = hashlib.sha256()
        self.position = 0

    def read(self, n: int) -> bytes:
        parts = []
        remaining = n
        while remaining:
            chunk = self._stream.read(min(remaining, _READ_CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            remaining -= len(chunk)
        data = b"".join(parts)
        self.digest.update(data)
        self.position += len(data)
        return data


def iter_frames(
    stream: BinaryIO, *, name: str = "file", digest: list | None = None
) -> Iterator[Frame]:
    """Yields every frame of a TFRecord stream in order, each CRC-checked.

    Args:
      stream: a binary stream positioned at the start of the file.
      name: what to call the file in errors.
      digest: if given, a list that receives ``(num_bytes, sha256 hex)`` of the whole stream
        once it has been read to its end.

    Raises:
      FrameError: at the first damaged or truncated frame, naming the file and byte offset
        (the frames yielded before it are intact).
    """
    reader = _Reader(stream)
    while True:
        offset = reader.position
        header = reader.read(_HEADER)
        if not header:
            break
        where = f"{name}: record at byte {offset}"
        if len(header) < _HEADER:
            raise FrameError(f"{where}: truncated inside the record header")
        length = _payload_length(header, where)
        body = reader.read(length + _FOOTER)
        if len(body) < length + _FOOTER:
            raise FrameError(f"{where}: truncated (the file ends inside the record)")
        payload = body[:length]
        (crc,) = struct.unpack("<I", body[length:])
        if masked_crc32c(payload) != crc:
            raise FrameError(f"{where}: data CRC mismatch (the record is damaged)")
        yield Frame(offset, frame_length(length), payload)
    if digest is not None:
        digest.append((reader.position, reader.digest.hexdigest()))
