"""Sorted JSON-lines reports (``rejected.jsonl``, ``duplicates.jsonl``) written with bounded
memory, however many lines they have, and merged on many workers.

A report used to be one in-memory list handed to one call (a side input), sorted and written
there: a build whose inputs were mostly bad held every rejection at once. Then one step merged
every sorted run, so one worker read every line. Here:

1. each bundle sorts at most ``run_size`` elements at a time and spills each sorted run to
   ``DST/.staging/reports/<report>/<uuid>.jsonl``, emitting the run's path, its line and byte
   counts, and a few evenly spaced lines of it (``_SAMPLES_PER_RUN``, the samples);
2. one small step counts the lines, chooses ``P = ceil(lines / range_lines)`` key ranges (at
   least 1: a small report is one range) and, from the samples weighted by the lines they stand
   for, the ``P - 1`` boundaries between them (encoded lines; equal boundaries leave a range
   empty);
3. each run is cut on its own worker into one byte range per key range it reaches (a range
   holds the elements ``e`` with ``boundary[r-1] <= e < boundary[r]``, so equal elements always
   meet in one range); with one range nothing is read;
4. the pieces are grouped by range, and each range is merged on its own worker
   (``heapq.merge``, at most ``fan_in`` files open at once, in passes when there are more) into
   a part file ``.../parts/<range>-<uuid>.jsonl`` of report lines, summarised on the way
   (``Summarizer``), the summarizer's state going with the part;
5. one step copies the parts' bytes, in range order, into a local file that is then written
   to ``DST/<report>`` (a temporary name then a rename, as ``write_object`` does), and merges
   the parts' summary states in range order: the summary is the one a single pass would give.

Per worker: a spilling bundle holds one run; a cut reads one run; a range merge holds its
pieces' names and ``fan_in`` open files, and writes its range (about ``range_lines`` lines) to
local disk; the last step holds one name and summary state a range and copies 8 MiB at a time.
What stays in one worker: the samples (``_SAMPLES_PER_RUN`` lines a run) and the final byte
copy. The order and the bytes are those of ``sorted(elements)`` written one ``to_json()`` per
line, whatever the runner's bundles and however many ranges.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from beam_pipelines.engines.filesystems import read_object, read_range, write_object
from beam_pipelines.output.catalog_io import STAGING_DIR

__all__ = [
    "REPORTS_DIR",
    "DEFAULT_RUN_SIZE",
    "DEFAULT_FAN_IN",
    "DEFAULT_RANGE_LINES",
    "Summarizer",
    "merge_runs",
    "choose_boundaries",
    "WriteSortedReport",
]

REPORTS_DIR = "reports"
DEFAULT_RUN_SIZE = 20_000
DEFAULT_FAN_IN = 64
# About one key range (one merging worker) per this many report lines.
DEFAULT_RANGE_LINES = 1_000_000
_SAMPLES_PER_RUN = 4
_PARTS_DIR = "parts"
_COPY_CHUNK = 8 * 1024 * 1024


class Summarizer(Protocol):
    """Summarises a report: sees the elements of one key range once, in order, keeping only
    bounded state; the ranges' states are then merged, in range order, into a fresh one.

    ``merge(state)`` must leave the summarizer as if it had ``add``-ed the elements behind
    ``state`` after everything it has seen: states come in range order (every element of a
    range sorts before those of the next), so a summary that depends on the order, such as the
    first element of a group, stays exact. ``state()`` is plain data (built-in types and the
    elements), since it goes from one worker to another.
    """

    def add(self, element: Any) -> None: ...

    def state(self) -> Any: ...

    def merge(self, state: Any) -> None: ...

    def result(self) -> dict[str, Any]: ...


class _Run(NamedTuple):
    """One sorted run spilled by a bundle."""

    path: str
    lines: int
    num_bytes: int
    samples: tuple[tuple[str, int], ...]  # (encoded line, how many lines it stands for)


class _Part(NamedTuple):
    """One key range merged: its report lines and its summary state."""

    number: int
    path: str
    num_bytes: int
    state: Any


def _encode(element: tuple) -> str:
    return json.dumps(list(element), ensure_ascii=False, separators=(",", ":")) + "\n"


def _samples(lines: list[str]) -> tuple[tuple[str, int], ...]:
    # The middle line of each of k near-equal slices of a sorted run, with the slice's length.
    k = min(len(lines), _SAMPLES_PER_RUN)
    cuts = [i * len(lines) // k for i in range(k + 1)]
    return tuple((lines[(a + b) // 2], b - a) for a, b in itertools.pairwise(cuts))


class _SpillSortedFn(beam.DoFn):
    """``element -> _Run``: each sorted run of at most ``run_size`` elements, spilled."""

    def __init__(self, runs_dir: str, run_size: int) -> None:
        self._runs_dir = runs_dir
        self._run_size = run_size
        self._buffer: list[Any] = []

    def start_bundle(self) -> None:
        self._buffer = []

    def _spill(self) -> _Run:
        lines = [_encode(e) for e in sorted(self._buffer)]
        self._buffer = []
        data = "".join(lines).encode("utf-8")
        path = FileSystems.join(self._runs_dir, f"{uuid.uuid4().hex}.jsonl")
        write_object(path, data)
        return _Run(path, len(lines), len(data), _samples(lines))

    def process(self, element):
        self._buffer.append(element)
        if len(self._buffer) >= self._run_size:
            yield self._spill()

    def finish_bundle(self):
        if self._buffer:
            yield GlobalWindows.windowed_value(self._spill())


def _decoder(element_type: Callable[..., Any]) -> Callable[[str | bytes], Any]:
    return lambda line: element_type(*json.loads(line))


def choose_boundaries(
    samples: Iterable[tuple[str, int]], element_type: Callable[..., Any], ranges: int
) -> list[str]:
    """The ``ranges - 1`` boundaries that cut the sampled elements into ranges of near-equal
    weight, as encoded lines in ascending order (repeated when one element weighs more than a
    range).

    Args:
      samples: ``(encoded line, weight)`` pairs, the weight the number of lines it stands for.
      element_type: builds an element from its fields, to compare the lines as elements.
      ranges: how many ranges, at least 1.

    Raises:
      ValueError: if ``ranges`` is below 1.
    """
    if ranges < 1:
        raise ValueError(f"a report is merged in at least 1 range, got {ranges}")
    decode = _decoder(element_type)
    ordered = sorted(((decode(line), weight, line) for line, weight in samples), key=_first)
    total = sum(weight for _, weight, _ in ordered)
    boundaries: list[str] = []
    seen = 0
    for _, weight, line in ordered:
        seen += weight
        # The j-th boundary is the first sample at which j / ranges of the weight is reached.
        while len(boundaries) < ranges - 1 and seen * ranges >= (len(boundaries) + 1) * total:
            boundaries.append(line)
    return boundaries


def _first(item: tuple) -> Any:
    return item[0]


def _choose_ranges(
    _, runs: list[_Run], element_type: Callable[..., Any], range_lines: int
) -> Iterator[list[str]]:
    lines = sum(run.lines for run in runs)
    ranges = max(1, -(-lines // range_lines))
    yield choose_boundaries(
        (sample for run in runs for sample in run.samples), element_type, ranges
    )


class _CutRunFn(beam.DoFn):
    """``_Run -> (range, (path, start, end))``: the bytes of a run in each key range."""

    def __init__(self, element_type: Callable[..., Any]) -> None:
        self._element_type = element_type
        self._boundaries: list[str] | None = None
        self._decoded: list[Any] = []

    def process(self, run: _Run, boundaries: list[str]):
        if not boundaries:  # one range: the whole run, unread
            yield 0, (run.path, 0, run.num_bytes)
            return
        decode = _decoder(self._element_type)
        if boundaries is not self._boundaries:
            self._boundaries, self._decoded = boundaries, [decode(b) for b in boundaries]
        rows = read_object(run.path).split(b"\n")[:-1]  # one run: at most run_size lines
        offsets = list(itertools.accumulate((len(row) + 1 for row in rows), initial=0))
        # Range r holds boundary[r-1] <= e < boundary[r]: cut before the first e >= boundary.
        cuts = [0]
        for boundary in self._decoded:
            cuts.append(bisect.bisect_left(rows, boundary, lo=cuts[-1], key=decode))
        cuts.append(len(rows))
        for number, (first, end) in enumerate(itertools.pairwise(cuts)):
            if first < end:
                yield number, (run.path, offsets[first], offsets[end])


def _read_run(path: str, element_type: Callable[..., Any]) -> Iterator[Any]:
    decode = _decoder(element_type)
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            yield decode(line)


def merge_runs(
    local_runs: list[str],
    destination: str,
    element_type: Callable[..., Any],
    *,
    fan_in: int = DEFAULT_FAN_IN,
    workdir: str,
) -> Iterator[Any]:
    """Merges sorted local run files into the report ``destination`` (a local path), in passes
    of at most ``fan_in`` files; yields every element, in order, as its line is written.

    Args:
      local_runs: local files of ``json.dumps(list(element))`` lines, each sorted.
      destination: the local file to write, one ``element.to_json()`` per line.
      element_type: builds an element from its fields (a NamedTuple class).
      fan_in: the most files open at once.
      workdir: a local directory for the intermediate passes.
    """
    runs = list(local_runs)
    while len(runs) > fan_in:
        merged = []
        for start in range(0, len(runs), fan_in):
            group = runs[start : start + fan_in]
            path = os.path.join(workdir, f"pass-{uuid.uuid4().hex}.jsonl")
            with open(path, "w", encoding="utf-8") as out:
                for element in heapq.merge(*(_read_run(r, element_type) for r in group)):
                    out.write(_encode(element))
            for r in group:
                os.remove(r)
            merged.append(path)
        runs = merged
    with open(destination, "w", encoding="utf-8") as out:
        for element in heapq.merge(*(_read_run(r, element_type) for r in runs)):
            out.write(element.to_json() + "\n")
            yield element


class _MergeRangeFn(beam.DoFn):
    """``(range, [(path, start, end)]) -> _Part``: one key range's pieces merged into a part."""

    def __init__(
        self,
        parts_dir: str,
        element_type: Callable[..., Any],
        summarizer: Callable[[], Summarizer],
        fan_in: int,
    ) -> None:
        self._parts_dir = parts_dir
        self._element_type = element_type
        self._summarizer = summarizer
        self._fan_in = fan_in

    def process(self, keyed):
        number, pieces = keyed
        summary = self._summarizer()
        with tempfile.TemporaryDirectory(prefix="report-range-") as work:
            local_runs = []
            for index, (path, start, end) in enumerate(sorted(pieces)):
                local = os.path.join(work, f"piece-{index}.jsonl")
                with open(local, "wb") as handle:
                    handle.write(read_range(path, start, end))  # at most one run
                local_runs.append(local)
            part = os.path.join(work, "part.jsonl")
            for element in merge_runs(
                local_runs, part, self._element_type, fan_in=self._fan_in, workdir=work
            ):
                summary.add(element)
            num_bytes = os.path.getsize(part)
            path = FileSystems.join(self._parts_dir, f"{number:06d}-{uuid.uuid4().hex}.jsonl")
            write_object(path, local_path=part)
        yield _Part(number, path, num_bytes, summary.state())


class _ConcatenateFn(beam.DoFn):
    """``None -> dict``: the parts copied in range order into the report; the summary."""

    def __init__(self, destination: str, summarizer: Callable[[], Summarizer]) -> None:
        self._destination = destination
        self._summarizer = summarizer

    def process(self, _, parts: list[_Part]):
        summary = self._summarizer()
        with tempfile.TemporaryDirectory(prefix="report-concatenate-") as work:
            report = os.path.join(work, "report.jsonl")
            with open(report, "wb") as out:
                for part in sorted(parts, key=_first):
                    for start in range(0, part.num_bytes, _COPY_CHUNK):
                        end = min(start + _COPY_CHUNK, part.num_bytes)
                        out.write(read_range(part.path, start, end))
                    summary.merge(part.state)
            write_object(self._destination, local_path=report)
        yield summary.result()


class WriteSortedReport(beam.PTransform):
    """``element -> dict`` (one element): writes a sorted JSON-lines report with bounded memory,
    merged by key range on many workers; returns what the summarizer made of the elements.

    Args:
      output_dir: the dataset directory; the report is ``output_dir/name``.
      name: the report's file name, e.g. ``rejected.jsonl``.
      element_type: the elements' NamedTuple class (fields JSON-able, a ``to_json`` method).
      summarizer: makes a ``Summarizer``, which sees the elements in sorted order, one key range
        at a time, and returns a JSON-able dict (counts).
      run_size: the most elements a bundle sorts in memory at once.
      fan_in: the most run files merged at once.
      range_lines: about how many lines one worker merges: the report is cut into
        ``ceil(lines / range_lines)`` key ranges.

    Raises:
      ValueError: if a size is out of range, naming it.
    """

    def __init__(
        self,
        output_dir: str,
        name: str,
        element_type: Callable[..., Any],
        summarizer: Callable[[], Summarizer],
        *,
        run_size: int = DEFAULT_RUN_SIZE,
        fan_in: int = DEFAULT_FAN_IN,
        range_lines: int = DEFAULT_RANGE_LINES,
    ) -> None:
        super().__init__()
        if run_size < 1 or fan_in < 2 or range_lines < 1:
            raise ValueError(
                f"run_size ({run_size}) must be >= 1, fan_in ({fan_in}) >= 2 and range_lines "
                f"({range_lines}) >= 1"
            )
        self._destination = FileSystems.join(output_dir, name)
        stem = name.rsplit(".", 1)[0]
        self._runs_dir = FileSystems.join(output_dir, STAGING_DIR, REPORTS_DIR, stem)
        self._element_type = element_type
        self._summarizer = summarizer
        self._run_size = run_size
        self._fan_in = fan_in
        self._range_lines = range_lines

    def expand(self, elements):
        element_type, summarizer = self._element_type, self._summarizer
        runs = elements | "SpillSortedRuns" >> beam.ParDo(
            _SpillSortedFn(self._runs_dir, self._run_size)
        )
        # _Run: one sorted run's path, line and byte counts, samples
        boundaries = (
            elements.pipeline
            | "OnceForRanges" >> beam.Create([None])
            | "ChooseRanges"
            >> beam.FlatMap(
                _choose_ranges, beam.pvalue.AsList(runs), element_type, self._range_lines
            )
            # [str]: the encoded boundaries between the key ranges, one element
        )
        parts = (
            runs
            | "CutRuns" >> beam.ParDo(_CutRunFn(element_type), beam.pvalue.AsSingleton(boundaries))
            # (range, (path, start, end)): the bytes of one run in one key range
            | "GroupByRange" >> beam.GroupByKey()
            | "MergeRanges"
            >> beam.ParDo(
                _MergeRangeFn(
                    FileSystems.join(self._runs_dir, _PARTS_DIR),
                    element_type,
                    summarizer,
                    self._fan_in,
                )
            )
            # _Part: one key range's report lines and summary state
        )
        return (
            elements.pipeline
            | "Once" >> beam.Create([None])
            | "ConcatenateParts"
            >> beam.ParDo(_ConcatenateFn(self._destination, summarizer), beam.pvalue.AsList(parts))
            # dict: the summary, one element
        )
