"""Where a listing can be cut, so that its records are parsed on many workers.

A listing of a billion lines is tens of gigabytes: read whole by one task, every record it
holds sits in that task's output. ``listing_ranges`` reads the file once, a block at a time,
and returns byte ranges of about ``range_bytes`` that each start and end on a record boundary,
with the number of the line each starts on, so that each range is parsed on its own
(``listings.range_sources``) and reports the same line numbers as a whole-file read.

A record boundary is a point where a parser starting afresh reads what a parser reading the
whole file reads:

- JSON Lines: after every ``\\n`` (a JSON string cannot hold a raw newline);
- CSV, while the file holds no ``"`` and no lone ``\\r``: after every ``\\n`` (every field is
  unquoted, so every line is one record);
- CSV from the first block holding a ``"`` or a lone ``\\r`` on: after each record as Python's
  ``csv`` module parses it (``strict``, lines split as ``newline=""`` splits them), so that a
  quoted field's newlines, a quote inside an unquoted field and an unterminated quote (which
  swallows the rest of the file into one bad record) are cut exactly as the whole-file read
  cuts them. This path runs at the ``csv`` module's speed; the first runs at the disk's.

Memory is one block plus the longest line, whatever the file's size. The scan is sequential:
at a billion lines it reads the file once in one task, as a reader of its bytes, while the
parsing (where the records are made) runs on the workers.
"""

from __future__ import annotations

import csv
import io
from typing import NamedTuple

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.engines.filesystems import read_range

__all__ = [
    "DEFAULT_RANGE_BYTES",
    "ListingRange",
    "estimate_records",
    "listing_ranges",
    "open_range",
]

# About 130 k records of 60 bytes: one range's records stay a few tens of megabytes in a
# worker's output, and a 60 GB listing is about 7,000 ranges.
DEFAULT_RANGE_BYTES = 8 << 20
_BLOCK = 1 << 20
_BOM = b"\xef\xbb\xbf"


class ListingRange(NamedTuple):
    """Bytes ``[start, end)`` of ``listing``, whole records only, starting on line ``first_line``
    (1-based)."""

    listing: str
    start: int
    end: int
    first_line: int


def _open(listing: str):
    return FileSystems.open(listing, compression_type=CompressionTypes.UNCOMPRESSED)


def open_range(part: ListingRange) -> io.BytesIO:
    """The bytes of one range: one ranged GET on a bucket, retried if cut short
    (``engines.filesystems.read_range``)."""
    return io.BytesIO(read_range(part.listing, part.start, part.end))


class _Cutter:
    """Collects record boundaries (byte offset, lines before it) into ranges of about
    ``range_bytes``."""

    def __init__(self, listing: str, range_bytes: int) -> None:
        self.listing, self.range_bytes = listing, range_bytes
        self.start, self.first_line = 0, 1
        self.ranges: list[ListingRange] = []

    def boundary(self, offset: int, lines_before: int) -> None:
        if offset - self.start >= self.range_bytes:
            self.ranges.append(ListingRange(self.listing, self.start, offset, self.first_line))
            self.start, self.first_line = offset, lines_before + 1

    def close(self, size: int) -> list[ListingRange]:
        if size > self.start:
            self.ranges.append(ListingRange(self.listing, self.start, size, self.first_line))
        return self.ranges


def _plain(block: bytes, csv_listing: bool) -> bool:
    """Whether every ``\\n`` of ``block`` (whole lines) ends a record whatever came before."""
    if not csv_listing:
        return True
    return b'"' not in block and block.count(b"\r") == block.count(b"\r\n")


def _cut_by_csv(listing: str, start: int, lines_before: int, cutter: _Cutter) -> int:
    """Cuts after each record as the ``csv`` module reads the file from ``start`` (a boundary);
    returns the file's size."""
    with _open(listing) as handle:
        handle.seek(start)
        if start == 0 and handle.read(len(_BOM)) != _BOM:
            handle.seek(0)
        offset = handle.tell()
        # The same decoding as the whole-file read; surrogateescape keeps every byte, so a
        # line's length in bytes is its text encoded back.
        text = io.TextIOWrapper(handle, encoding="utf-8", errors="surrogateescape", newline="")
        consumed = [offset, lines_before]

        def lines():
            for line in text:
                consumed[0] += len(line.encode("utf-8", "surrogateescape"))
                consumed[1] += 1
                yield line

        reader = csv.reader(lines(), strict=True)
        while True:
            try:
                next(reader)
            except StopIteration:
                return consumed[0]
            except csv.Error:
                pass  # the reader starts afresh on the next line, as a range's reader would
            cutter.boundary(*consumed)


def listing_ranges(listing: str, range_bytes: int = DEFAULT_RANGE_BYTES) -> list[ListingRange]:
    """The listing cut into ranges of whole records, about ``range_bytes`` each (the last and
    any holding one long record may differ), in file order; none for an empty file.

    Raises:
      ValueError: if ``range_bytes`` is below 1.
      OSError (or the file system's own error): if the listing cannot be read.
    """
    if range_bytes < 1:
        raise ValueError(f"range_bytes must be at least 1, got {range_bytes}")
    csv_listing = not listing.lower().endswith(".jsonl")
    cutter = _Cutter(listing, range_bytes)
    offset, lines, pending = 0, 0, b""  # offset: where ``pending`` starts
    with _open(listing) as handle:
        while True:
            block = handle.read(_BLOCK)
            data = pending + block
            whole = data.rfind(b"\n") + 1 if block else len(data)
            if not _plain(data[:whole], csv_listing):
                return cutter.close(_cut_by_csv(listing, offset, lines, cutter))
            position = 0
            # The first newline at or past the next cut: a boundary ``p`` cuts when
            # ``offset + p - start >= range_bytes``; the lines between are only counted.
            while True:
                due = max(position, cutter.start + range_bytes - offset - 1)
                newline = data.find(b"\n", due, whole)
                if newline < 0:
                    break
                lines += data.count(b"\n", position, newline + 1)
                position = newline + 1
                cutter.boundary(offset + position, lines)
            lines += data.count(b"\n", position, whole)
            if not block:
                return cutter.close(offset + len(data))
            offset, pending = offset + whole, data[whole:]


def estimate_records(listing: str, sample_bytes: int = _BLOCK) -> int:
    """About how many lines ``listing`` holds, from its size and its first ``sample_bytes``
    (exact when the file is no longer): what the launcher knows of a build's size before the
    job starts, without reading the file.

    Raises:
      OSError (or the file system's own error): if the listing cannot be read.
    """
    size = FileSystems.match([listing], limits=[1])[0].metadata_list[0].size_in_bytes
    with _open(listing) as handle:
        head = handle.read(sample_bytes)
    lines = head.count(b"\n")
    if len(head) >= size:
        return lines + (1 if head and not head.endswith(b"\n") else 0)
    return max(1, round(size * lines / len(head)))
