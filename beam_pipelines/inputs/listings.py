"""Listings read as their formats define them, and class names checked before they are stored.

A ``.csv`` listing is read by RFC 4180 with Python's ``csv`` module, so a quoted field may hold
commas, doubled quotes and newlines; a ``.jsonl`` listing is one JSON object a line. The file is
cut into ranges of whole records (``listing_ranges``) that are parsed on their own, each
reporting the line numbers of the whole file. Each record becomes a ``SourceFile``; a record
that cannot be used (wrong number of fields, not JSON, no URI, bytes that are not UTF-8)
becomes one too, carrying its problem
(``bad_listing_line``) and its line number, so that the image step rejects it on its own and
the job goes on.

A class name must survive every format it is written to (TFRecord text, catalog, JSON and CSV
reports, a terminal): ``check_label`` refuses empty names and names holding control
characters, line or paragraph separators, or bidirectional overrides (``bad_label``). Long
names are kept whole; only displays shorten them (``display_label``).
"""

from __future__ import annotations

import csv
import io
import json
import unicodedata
from collections.abc import Iterator
from typing import BinaryIO, TextIO

from apache_beam.io.filesystems import FileSystems

from beam_pipelines.elements import SourceFile
from beam_pipelines.inputs.listing_ranges import (
    DEFAULT_RANGE_BYTES,
    ListingRange,
    listing_ranges,
    open_range,
)

__all__ = [
    "BAD_LINE",
    "BAD_LABEL",
    "check_label",
    "labelled_source",
    "normalise_label",
    "display_label",
    "listing_sources",
    "range_sources",
]

BAD_LINE = "bad_listing_line"
BAD_LABEL = "bad_label"
# Characters that reorder or hide text: a class name holding one displays as another name.
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff"
)
# Control characters (tabs, newlines, NUL…), lone surrogates (bytes that were not UTF-8) and
# line and paragraph separators.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
_DISPLAY_CHARS = 40


def normalise_label(label: str) -> str:
    """A class name as stored: NFC-normalised (macOS writes decomposed names), stripped."""
    return unicodedata.normalize("NFC", label).strip()


def check_label(label: str) -> str | None:
    """Why a (normalised) class name cannot be stored safely, or None when it can."""
    if not label:
        return "the class name is empty"
    for position, char in enumerate(label):
        if char in _BIDI_CONTROLS or unicodedata.category(char) in _REFUSED_CATEGORIES:
            name = unicodedata.name(char, "a control character")
            return (
                f"the class name {display_label(label)!r} holds U+{ord(char):04X} ({name}) at "
                f"position {position}; class names may not hold control characters, line "
                "separators or bidirectional overrides"
            )
    return None


def display_label(label: str, width: int = _DISPLAY_CHARS) -> str:
    """A class name shortened to ``width`` characters for tables and messages (data keep it whole)."""
    return label if len(label) <= width else label[: width - 1] + "…"


def labelled_source(uri: str, label: str, where: str) -> SourceFile:
    """The input ``uri`` of class ``label``, or one carrying ``bad_label`` (``where``: for the
    detail, the listing line or directory it came from) when the name cannot be stored."""
    label = normalise_label(label)
    problem = check_label(label)
    if problem is not None:
        return SourceFile(uri, None, (BAD_LABEL, f"{where}: {problem}"))
    return SourceFile(uri, label)


def _resolve(uri: str, base: str) -> str:
    if "://" in uri or uri.startswith("/"):
        return uri
    return FileSystems.join(base, uri)


def _bad(listing: str, first: int, last: int, detail: str) -> SourceFile:
    lines = f"line {first}" if first == last else f"lines {first}-{last}"
    return SourceFile(
        f"{listing}#{lines.replace(' ', '=')}", None, (BAD_LINE, f"{lines} of {listing}: {detail}")
    )


def _csv_sources(stream: TextIO, listing: str, base: str, line: int) -> Iterator[SourceFile]:
    reader = csv.reader(stream, strict=True)
    before = line - 1  # lines of the file before the stream's first
    while True:
        first = before + reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:  # an unterminated quote, say: the rest of that record is lost
            yield _bad(listing, first, max(first, before + reader.line_num), f"not CSV ({e})")
            continue
        last = before + reader.line_num
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue  # a blank line
        if [f.strip() for f in fields] == ["uri", "label"]:
            continue  # the header
        where = f"line {first} of {listing}"
        if any("\udc80" <= c <= "\udcff" for f in fields for c in f):
            yield _bad(listing, first, last, "bytes that are not UTF-8")
        elif len(fields) != 2:
            detail = f"{len(fields)} fields; expected 2: uri,label (quote a field holding a comma)"
            yield _bad(listing, first, last, detail)
        elif not fields[0].strip():
            yield _bad(listing, first, last, "an empty uri")
        else:
            yield labelled_source(_resolve(fields[0].strip(), base), fields[1], where)


def _jsonl_sources(stream: BinaryIO, listing: str, base: str, line: int) -> Iterator[SourceFile]:
    for number, raw in enumerate(stream, start=line):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            yield _bad(
                listing,
                number,
                number,
                f'not a JSON object ({e}); expected {{"uri": ..., "label": ...}}',
            )
            continue
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("uri"), str)
            or not isinstance(row.get("label"), str)
        ):
            yield _bad(listing, number, number, 'expected an object with string "uri" and "label"')
        elif not row["uri"].strip():
            yield _bad(listing, number, number, "an empty uri")
        else:
            yield labelled_source(
                _resolve(row["uri"].strip(), base), row["label"], f"line {number} of {listing}"
            )


def range_sources(part: ListingRange) -> Iterator[SourceFile]:
    """Every record of one range of a listing (``listing_ranges``) as a ``SourceFile``, in
    order, with the line numbers of the whole file; see ``listing_sources``.

    Raises:
      OSError (or the file system's own error): if the listing cannot be read at all.
    """
    listing = part.listing
    base = FileSystems.split(listing)[0]
    stream = open_range(part)
    if listing.lower().endswith(".jsonl"):
        yield from _jsonl_sources(stream, listing, base, part.first_line)
        return
    # newline="" as the csv module asks: quoted fields keep their own line breaks. Only the
    # file's first bytes may be a byte-order mark.
    encoding = "utf-8-sig" if part.start == 0 else "utf-8"
    text = io.TextIOWrapper(stream, encoding=encoding, errors="surrogateescape", newline="")
    yield from _csv_sources(text, listing, base, part.first_line)


def listing_sources(listing: str, range_bytes: int = DEFAULT_RANGE_BYTES) -> Iterator[SourceFile]:
    """Every record of a ``.csv`` or ``.jsonl`` listing as a ``SourceFile``, in order.

    Relative URIs are resolved against the listing's directory. A record that cannot be used
    is a ``SourceFile`` with a ``problem`` naming its line numbers (``bad_listing_line`` or
    ``bad_label``); blank lines and a CSV ``uri,label`` header are skipped. The pipeline reads
    the same records range by range on its workers (``listing_ranges``, ``range_sources``);
    this reads the ranges one after another.

    Raises:
      OSError (or the file system's own error): if the listing cannot be read at all.
    """
    for part in listing_ranges(listing, range_bytes):
        yield from range_sources(part)
