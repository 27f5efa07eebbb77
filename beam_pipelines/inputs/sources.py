"""Which files go in, and with which class: directory trees and ``uri,label`` listings.

A directory (or object-store prefix) is laid out as ``<class name>/<image file>``; files nested
deeper take the class of their top-level directory, and files directly under the root have no
class (they are reported as ``no_label``, never dropped). Hidden files and folders (``.*``) and
what file managers leave behind (``__MACOSX``, ``Thumbs.db``, ``desktop.ini``) are skipped: they
are counted as skipped, never read and never reported as bad input. A ``.csv`` or ``.jsonl``
listing names each file and its class, and is taken as it is (nothing skipped); relative URIs are
resolved against the listing's directory. Listings are read by their formats' own rules
(``listings``): a line that cannot be used is an input rejected on its own, never a failed job.

Class names are NFC-normalised (macOS writes decomposed names) and may hold spaces and any
Unicode letters, but no control characters (``listings.check_label``). Label indices are
positions in the sorted list of distinct class names.
"""

from __future__ import annotations

import csv
import json
import pickle
import zlib
from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from beam_pipelines.elements import SourceFile
from beam_pipelines.engines.filesystems import list_one_level
from beam_pipelines.inputs.listing_ranges import DEFAULT_RANGE_BYTES, ListingRange, listing_ranges
from beam_pipelines.inputs.listings import labelled_source, range_sources

__all__ = [
    "LISTING_SUFFIXES",
    "SKIPPED_TAG",
    "is_listing",
    "is_skipped",
    "source_from_path",
    "parse_listing_line",
    "MatchTree",
    "unpack_sources",
    "ReshuffleInBatches",
    "ListSources",
    "LabelNames",
]

LISTING_SUFFIXES = (".csv", ".jsonl")
SKIPPED_TAG = "skipped"
# Left by file managers and archivers, never images: a path with one of these parts is skipped.
_SYSTEM_NAMES = frozenset({"__macosx", "thumbs.db", "desktop.ini"})


def is_listing(input_path: str) -> bool:
    """True if ``input_path`` names a ``.csv`` or ``.jsonl`` listing rather than a directory."""
    return input_path.lower().endswith(LISTING_SUFFIXES)


def is_skipped(relative_path: str) -> bool:
    """True if a path under the input root is hidden (any part starts with ``.``) or a file
    manager's own file (``__MACOSX``, ``Thumbs.db``, ``desktop.ini``, in any case)."""
    return any(
        part.startswith(".") or part.lower() in _SYSTEM_NAMES
        for part in relative_path.split("/")
        if part
    )


def source_from_path(path: str, root: str) -> SourceFile:
    """Derives the class of a file found under ``root`` from its first directory.

    Raises:
      ValueError: if ``path`` is not under ``root``.
    """
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"matched file {path!r} is not under the input directory {root!r}")
    parts = path[len(prefix) :].split("/")
    if len(parts) < 2:
        return SourceFile(path, None)
    return labelled_source(path, parts[0], f"class directory {parts[0]!r}")


def parse_listing_line(line: str, *, jsonl: bool, base: str) -> SourceFile | None:
    """Parses one line of a listing on its own; returns None for blank lines and the CSV header.

    The pipeline reads listings in ranges of whole records (``listings.range_sources``, where a
    CSV record may span lines); this is for one line known to be whole. A class name that
    cannot be stored gives a ``SourceFile`` carrying ``bad_label``.

    Args:
      line: the text of the line.
      jsonl: True for ``{"uri": ..., "label": ...}`` lines, False for CSV ``uri,label``.
      base: the directory relative URIs are resolved against.

    Raises:
      ValueError: naming the line and the expected layout.
    """
    if not line.strip():
        return None
    if jsonl:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f'listing line is not JSON: {line!r}; expected {{"uri": ..., "label": ...}}'
            ) from e
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("uri"), str)
            or not isinstance(row.get("label"), str)
        ):
            raise ValueError(
                f'listing line {line!r} must be an object with string "uri" and "label"'
            )
        uri, label = row["uri"], row["label"]
    else:
        fields = next(csv.reader([line]))
        if len(fields) != 2:
            raise ValueError(
                f"listing line {line!r} has {len(fields)} fields; expected 2: uri,label"
            )
        uri, label = fields
        if (uri.strip(), label.strip()) == ("uri", "label"):
            return None
    if not uri.strip():
        raise ValueError(f"listing line {line!r} has an empty uri")
    uri = uri.strip()
    resolved = uri if "://" in uri or uri.startswith("/") else FileSystems.join(base, uri)
    return labelled_source(resolved, label, f"listing line {line!r}")


class _ClassFromPath(beam.DoFn):
    """``FileMetadata -> SourceFile``; the path on the ``skipped`` output when it is skipped."""

    def __init__(self, root: str) -> None:
        self._root = root

    def process(self, meta):
        path = meta.path
        source = source_from_path(path, self._root)
        if is_skipped(path[len(self._root) + 1 :]):
            yield beam.pvalue.TaggedOutput(SKIPPED_TAG, path)
        else:
            yield source


class ListSources(beam.PTransform):
    """``PBegin -> {"sources": SourceFile, "batches": bytes, "skipped": str}``.

    ``sources``: every input file with its class, spread for decoding. ``batches``: the same
    inputs packed by ``RESHUFFLE_BATCH`` (``unpack_sources``), what the image step reads
    (``ReshuffleInBatches``). ``skipped``: the URI of every hidden or system file of a
    directory input (none for a listing).
    """

    def __init__(self, input_path: str, range_bytes: int = DEFAULT_RANGE_BYTES) -> None:
        """``range_bytes``: about how much of a listing file each task parses
        (``listing_ranges``)."""
        super().__init__()
        self._input = input_path
        self._range_bytes = range_bytes

    def expand(self, pbegin):
        if is_listing(self._input):
            batches = (
                pbegin
                | "Listing" >> beam.Create([self._input])
                # ListingRange: whole records, about 8 MB each, found by one read of the file
                | "CutListing" >> beam.FlatMap(listing_ranges, self._range_bytes)
                | "SpreadRanges" >> beam.Reshuffle()
                # bytes: RESHUFFLE_BATCH SourceFile packed (a bad record's carries its problem
                # and line numbers), packed as they are read: a task parsing ranges holds about
                # 8 bytes a record, not the 350 of a SourceFile
                | "ReadListing" >> beam.FlatMap(_range_batches)
            )
            skipped = pbegin | "NothingSkipped" >> beam.Create([])
            spread = batches | "Reshuffle" >> ReshuffleInBatches(packed=True)
            return {**spread, SKIPPED_TAG: skipped}
        root = self._input.rstrip("/")
        listed = (
            pbegin
            | "MatchFiles" >> MatchTree(root)
            # FileMetadata -> SourceFile, and str (skipped path) on the skipped output
            | "ClassFromPath"
            >> beam.ParDo(_ClassFromPath(root)).with_outputs(SKIPPED_TAG, main="sources")
        )
        sources, skipped = listed.sources, listed[SKIPPED_TAG]
        # Matching yields files in one bundle; reshuffling lets decoding fan out over workers.
        spread = sources | "Reshuffle" >> ReshuffleInBatches()
        return {**spread, SKIPPED_TAG: skipped}


# Inputs per element of the reshuffle: few enough that a few hundred images still spread over
# workers, enough that the runner holds about 50 bytes per input instead of 500.
RESHUFFLE_BATCH = 32


def _pack(batch: list[tuple]) -> bytes:
    return zlib.compress(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL), 1)


def _range_batches(part: ListingRange) -> Iterator[bytes]:
    """``ListingRange -> bytes``: the range's records, ``RESHUFFLE_BATCH`` at a time, packed."""
    batch: list[tuple] = []
    for source in range_sources(part):
        batch.append(tuple(source))
        if len(batch) >= RESHUFFLE_BATCH:
            yield _pack(batch)
            batch = []
    if batch:
        yield _pack(batch)


class _BatchFn(beam.DoFn):
    """``SourceFile -> bytes``: ``RESHUFFLE_BATCH`` inputs at a time, packed (zlib, pickle)."""

    def start_bundle(self) -> None:
        self._batch: list[tuple] = []

    def _packed(self) -> bytes:
        batch, self._batch = self._batch, []
        return _pack(batch)

    def process(self, source: SourceFile):
        self._batch.append(tuple(source))
        if len(self._batch) >= RESHUFFLE_BATCH:
            yield self._packed()

    def finish_bundle(self):
        if self._batch:
            yield GlobalWindows.windowed_value(self._packed())


def unpack_sources(data: bytes) -> list[SourceFile]:
    """The inputs of one packed batch (``ListSources``' ``batches`` output), in order."""
    return [SourceFile(*fields) for fields in pickle.loads(zlib.decompress(data))]


class ReshuffleInBatches(beam.PTransform):
    """``SourceFile -> {"sources": SourceFile, "batches": bytes}``, spread over workers (a
    ``Reshuffle``) in packed batches: Beam runners hold what crosses a shuffle as objects (the
    in-process runner all of it).

    ``batches`` are the spread batches themselves (``RESHUFFLE_BATCH`` inputs each, see
    ``unpack_sources``), ``sources`` the inputs unpacked from them. The image step reads the
    batches and unpacks them itself: it waits for the class names (a side input computed from
    ``sources``), and a runner holds whole what a step reads after such a wait. It then holds
    the packed batches (about 8 bytes per input) instead of every ``SourceFile`` (about 130).

    With ``packed=True`` the input is already packed batches (``bytes``), as a listing's
    ranges are read.
    """

    def __init__(self, packed: bool = False) -> None:
        super().__init__()
        self._packed = packed

    def expand(self, sources):
        if not self._packed:
            sources = sources | "Batch" >> beam.ParDo(_BatchFn())
        # bytes: RESHUFFLE_BATCH SourceFile, packed
        batches = sources | "Spread" >> beam.Reshuffle()
        return {"sources": batches | "Unbatch" >> beam.FlatMap(unpack_sources), "batches": batches}


class _ListTopLevelFn(beam.DoFn):
    """``root -> str | FileMetadata``: a ``<class dir>/**`` pattern per directory directly under
    the root, and the ``FileMetadata`` of each file directly under it."""

    def process(self, root: str):
        level = list_one_level(root)
        if level is None:
            yield FileSystems.join(root, "**")  # a scheme without a one-level listing
        else:
            dirs, files = level
            yield from (FileSystems.join(directory, "**") for directory in dirs)
            yield from files


class _MatchEachFn(beam.DoFn):
    """``str | FileMetadata -> FileMetadata``: every file a pattern matches; a file as it is."""

    def process(self, element):
        if isinstance(element, str):
            yield from FileSystems.match([element])[0].metadata_list
        else:
            yield element


class MatchTree(beam.PTransform):
    """``PBegin -> FileMetadata``: every file under ``root``, listed one class directory at a
    time, each on whichever worker takes it.

    One step lists the root's first level (a delimiter listing on buckets: directories and the
    files directly under the root); the directories are then spread over workers and each is
    matched on its own (``FileSystems.match``). What stays sequential: the first level, and
    each class directory's own listing (paginated, in one worker). Both kinds of element go
    through one path, so nothing is gathered in a ``Flatten`` (which runners materialise).
    """

    def __init__(self, root: str) -> None:
        super().__init__()
        self._root = root

    def expand(self, pbegin):
        return (
            pbegin
            | "Root" >> beam.Create([self._root])
            | "ListTopLevel" >> beam.ParDo(_ListTopLevelFn())
            # str: "<class dir>/**", or FileMetadata of a file directly under the root
            | "Spread" >> beam.Reshuffle()
            | "MatchEach" >> beam.ParDo(_MatchEachFn())
            # FileMetadata
        )


def _sorted_names(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(names)))


class LabelNames(beam.PTransform):
    """``SourceFile -> tuple[str, ...]``: one element, the sorted distinct class names."""

    def expand(self, sources):
        return (
            sources
            | "Labels" >> beam.FlatMap(lambda s: [s.label] if s.label is not None else [])
            | "Distinct" >> beam.Distinct()
            # str
            | "Collect" >> beam.combiners.ToList()
            | "Sort" >> beam.Map(_sorted_names)
        )
