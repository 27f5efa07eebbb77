"""Sorted JSON-lines reports (``rejected.jsonl``, ``duplicates.jsonl``) written with bounded
memory, however many lines they have.

A report used to be one in-memory list handed to one call (a side input), sorted and written
there: a build whose inputs were mostly bad held every rejection at once. Here:

1. each bundle sorts at most ``run_size`` elements at a time and spills each sorted run to
   ``DST/.staging/reports/<report>/<uuid>.jsonl``, emitting only the run's path;
2. one step merges the runs (``heapq.merge``, at most ``fan_in`` files open at once, in passes
   when there are more), streaming into a local file that is then written to ``DST/<report>``
   under a temporary name and renamed, and counts what the summary needs on the way.

What stays sequential: the final merge, in one worker (it reads every line once). The order and
the bytes are those of ``sorted(elements)`` written one ``to_json()`` per line.
"""

from __future__ import annotations

import heapq
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from beam_pipelines.engines.filesystems import read_object, write_object
from beam_pipelines.output.catalog_io import STAGING_DIR

__all__ = [
    "REPORTS_DIR",
    "DEFAULT_RUN_SIZE",
    "DEFAULT_FAN_IN",
    "Summarizer",
    "merge_runs",
    "WriteSortedReport",
]

REPORTS_DIR = "reports"
DEFAULT_RUN_SIZE = 20_000
DEFAULT_FAN_IN = 64


class Summarizer(Protocol):
    """Sees every element of a report once, in order; keeps only bounded state."""

    def add(self, element: Any) -> None: ...

    def result(self) -> dict[str, Any]: ...


def _encode(element: tuple) -> str:
    return json.dumps(list(element), ensure_ascii=False, separators=(",", ":")) + "\n"


class _SpillSortedFn(beam.DoFn):
    """``element -> str``: the path of each sorted run of at most ``run_size`` elements."""

    def __init__(self, runs_dir: str, run_size: int) -> None:
        self._runs_dir = runs_dir
        self._run_size = run_size
        self._buffer: list[Any] = []

    def start_bundle(self) -> None:
        self._buffer = []

    def _spill(self) -> str:
        run, self._buffer = sorted(self._buffer), []
        path = FileSystems.join(self._runs_dir, f"{uuid.uuid4().hex}.jsonl")
        write_object(path, "".join(_encode(e) for e in run).encode("utf-8"))
        return path

    def process(self, element):
        self._buffer.append(element)
        if len(self._buffer) >= self._run_size:
            yield self._spill()

    def finish_bundle(self):
        if self._buffer:
            yield GlobalWindows.windowed_value(self._spill())


def _read_run(path: str, element_type: Callable[..., Any]) -> Iterator[Any]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            yield element_type(*json.loads(line))


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


class _MergeFn(beam.DoFn):
    def __init__(
        self,
        destination: str,
        element_type: Callable[..., Any],
        summarizer: Callable[[], Summarizer],
        fan_in: int,
    ) -> None:
        self._destination = destination
        self._element_type = element_type
        self._summarizer = summarizer
        self._fan_in = fan_in

    def process(self, _, runs: list[str]):
        with tempfile.TemporaryDirectory(prefix="report-merge-") as work:
            local_runs = []
            for number, path in enumerate(sorted(runs)):
                local = os.path.join(work, f"run-{number}.jsonl")
                with open(local, "wb") as handle:
                    handle.write(read_object(path))  # one run: at most run_size lines
                local_runs.append(local)
            report = os.path.join(work, "report.jsonl")
            summary = self._summarizer()
            for element in merge_runs(
                local_runs, report, self._element_type, fan_in=self._fan_in, workdir=work
            ):
                summary.add(element)
            write_object(self._destination, local_path=report)
        yield summary.result()


class WriteSortedReport(beam.PTransform):
    """``element -> dict`` (one element): writes a sorted JSON-lines report with bounded memory;
    returns what the summarizer made of the elements.

    Args:
      output_dir: the dataset directory; the report is ``output_dir/name``.
      name: the report's file name, e.g. ``rejected.jsonl``.
      element_type: the elements' NamedTuple class (fields JSON-able, a ``to_json`` method).
      summarizer: makes a ``Summarizer``, which sees every element in sorted order and returns
        a JSON-able dict (counts).
      run_size: the most elements a bundle sorts in memory at once.
      fan_in: the most run files merged at once.
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
    ) -> None:
        super().__init__()
        if run_size < 1 or fan_in < 2:
            raise ValueError(f"run_size ({run_size}) must be >= 1 and fan_in ({fan_in}) >= 2")
        self._destination = FileSystems.join(output_dir, name)
        stem = name.rsplit(".", 1)[0]
        self._runs_dir = FileSystems.join(output_dir, STAGING_DIR, REPORTS_DIR, stem)
        self._element_type = element_type
        self._summarizer = summarizer
        self._run_size = run_size
        self._fan_in = fan_in

    def expand(self, elements):
        runs = elements | "SpillSortedRuns" >> beam.ParDo(
            _SpillSortedFn(self._runs_dir, self._run_size)
        )
        # str: the path of one sorted run
        return (
            elements.pipeline
            | "Once" >> beam.Create([None])
            | "MergeRuns"
            >> beam.ParDo(
                _MergeFn(self._destination, self._element_type, self._summarizer, self._fan_in),
                beam.pvalue.AsList(runs),
            )
            # dict: the summary, one element
        )
