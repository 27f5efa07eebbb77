"""``--resume``: what an interrupted build left in ``DST/.staging/``, checked before it is trusted.

A build that dies (launcher killed, worker lost, runner failure, a bucket refusing writes) keeps
its staging area. Rerun with the same command plus ``--resume``, it reuses three things:

* ``plan.json``: the shard counts, reused as they are (a build whose content options differ is
  refused, naming them: ``plan.check_plan``);
* ``records/<uuid>.json`` sidecars: every staged example whose staging file is whole is reused
  by URI, so its image is neither read nor decoded again (``StagedFromEarlierAttempts``);
* ``done/<shard-stem>.json``: a shard committed with its index file and catalog fragment. It is
  trusted only after the shard's and the index file's size and SHA-256 are checked against it
  (``VerifyDoneShards``, in parallel); a trusted shard is not written again, and its
  duplicates come from the record. A record that fails its check is ignored: that shard is
  written again.

Rejected inputs leave nothing staged and are read again (they are rejected again, for the same
reason). The result is byte-identical to an uninterrupted build; ``--resume`` assumes the input
did not change in between.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.elements import Duplicate
from beam_pipelines.engines.filesystems import file_digest
from beam_pipelines.graph.plan import (
    check_plan,
    content_options,
    make_plan,
    plan_path,
    read_plan,
    write_plan,
)
from beam_pipelines.output.catalog_io import fragment_path
from beam_pipelines.output.done_records import (
    list_done_records,
    read_done_record,
    shard_result_from_record,
)
from beam_pipelines.output.publish import read_manifest
from beam_pipelines.output.staging import list_sidecars, read_sidecar, staging_dir
from beam_pipelines.summary import RunSummary
from catalog.index_files import index_filename
from cliflags import plural
from schemas.manifest import REJECTED_NAME, Manifest

__all__ = [
    "ResumeState",
    "load_resume_state",
    "start_build",
    "published_by_earlier_attempt",
    "summary_of_published",
    "DONE_TAG",
    "file_digest",
    "VerifyDoneShards",
    "StagedFromEarlierAttempts",
    "SplitReusable",
    "REUSED_TAG",
    "remove_stale_temporaries",
    "remove_staging",
]

DONE_TAG = "duplicates"
REUSED_TAG = "reused"
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED
_DELETE_BATCH = 1000
_log = logging.getLogger(__name__)
# objstore.atomic.temporary_path's names: ".<name>.tmp-" and 32 hex digits.
_TEMPORARY = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """What a build takes over from an interrupted one (empty for a fresh build).

    Attributes:
      shard_counts: the saved plan's counts, or None when there is no saved plan.
      done_records: paths of the done records to check and trust.
      sidecars: paths of the staged files' sidecars, whose examples are reused.
    """

    shard_counts: Mapping[str, int] | None = None
    done_records: tuple[str, ...] = ()
    sidecars: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.shard_counts is not None and not all(
            isinstance(n, int) and n >= 1 for n in self.shard_counts.values()
        ):
            raise ValueError(f"shard_counts must map splits to counts >= 1: {self.shard_counts!r}")

    def describe(self) -> str:
        """One line for the log: what is taken over."""
        if self.shard_counts is None:
            return "--resume: no saved plan: building from the start"
        plan = " and ".join(f"{n} {split}" for split, n in self.shard_counts.items())
        # "1 train and 1 validation shard": the noun agrees with the count next to it.
        shard = "shard" if list(self.shard_counts.values())[-1] == 1 else "shards"
        return (
            f"--resume: plan of {plan} {shard}; {plural(len(self.done_records), 'shard')} to "
            f"check, {plural(len(self.sidecars), 'staged file')} to reuse"
        )


def load_resume_state(output_dir: str, options: Mapping[str, Any]) -> ResumeState:
    """Reads what an interrupted build left in ``output_dir`` (done records are checked later,
    in the pipeline).

    Without a saved plan nothing is reused: the interrupted build wrote no shard and, staged
    examples aside, nothing worth keeping (staged examples could be reused, but the plan would
    be made again from the same listing anyway: they are reused too).

    Raises:
      ValueError: if the saved plan is unreadable or was made with other content options,
        naming them.
    """
    plan = read_plan(output_dir)
    sidecars = tuple(list_sidecars(output_dir))
    if plan is None:
        return ResumeState(sidecars=sidecars)
    check_plan(plan, options, path=plan_path(output_dir))
    return ResumeState(
        shard_counts=plan["shard_counts"],
        done_records=tuple(list_done_records(output_dir)),
        sidecars=sidecars,
    )


def start_build(
    output_dir: str,
    options: Mapping[str, Any],
    *,
    resume: bool,
    fixed_counts: Mapping[str, int] | None,
) -> ResumeState:
    """Readies ``DST/.staging/`` for a build; call after ``publish.prepare_output``.

    Without ``resume``, whatever an interrupted build left is deleted (with a warning that
    ``--resume`` would have continued it). With it, the saved plan and staged work are taken
    over (``load_resume_state``). Then, when the counts are fixed (``--num_shards``, or the
    saved plan), ``plan.json`` is written now, before any shard; otherwise the pipeline's
    planning step writes it.

    Raises:
      ValueError: from ``load_resume_state`` (a build with other options).
    """
    state = ResumeState()
    remove_stale_temporaries(output_dir)
    if resume:
        state = load_resume_state(output_dir, options)
        _log.info(state.describe())  # information, not a problem: the user asked for it
    elif FileSystems.exists(plan_path(output_dir)) or list_sidecars(output_dir):
        _log.warning(
            "%s holds an interrupted build: starting over (pass --resume to continue it)",
            staging_dir(output_dir),
        )
        remove_staging(output_dir)
    counts = state.shard_counts if state.shard_counts is not None else fixed_counts
    if counts is not None and state.shard_counts is None:
        write_plan(output_dir, make_plan(counts, options=options, rule="num_shards"))
    if counts is not None:
        state = dataclasses.replace(state, shard_counts=dict(counts))
    return state


def published_by_earlier_attempt(output_dir: str, options: Mapping[str, Any]) -> Manifest | None:
    """For ``--resume``: the dataset an earlier attempt of this very build already published.

    That is a ``dataset.json`` with the same content options and no ``plan.json`` (publishing
    deletes the plan first when it clears the staging area; while a plan exists, the build is
    not finished and is resumed instead).
    """
    if FileSystems.exists(plan_path(output_dir)):
        return None
    try:
        manifest = read_manifest(output_dir)
    except ValueError:
        return None
    if manifest is None or content_options(manifest.options) != content_options(options):
        return None
    return manifest


def summary_of_published(output_dir: str, manifest: Manifest, elapsed_s: float) -> RunSummary:
    """A ``RunSummary`` of a dataset already published (rejections counted from its report)."""
    reasons: dict[str, int] = {}
    path = FileSystems.join(output_dir, REJECTED_NAME)
    with FileSystems.open(path, compression_type=_UNCOMPRESSED) as handle:
        for line in io.TextIOWrapper(handle, encoding="utf-8"):  # streamed: reports may be long
            if line.strip():
                reason = json.loads(line)["reason"]
                reasons[reason] = reasons.get(reason, 0) + 1
    no_label = reasons.get("no_label", 0)
    labelled = manifest.counts.input - no_label
    bad = (manifest.counts.rejected - no_label) / labelled if labelled else 0.0
    remove_staging(output_dir)
    return RunSummary(
        output=output_dir,
        published=True,
        manifest=manifest,
        bad_fraction=bad,
        rejected_by_reason=dict(sorted(reasons.items())),
        metrics={},
        elapsed_s=elapsed_s,
    )


def _check_done(output_dir: str, record: dict[str, Any]) -> str | None:
    """Why a done record cannot be trusted, or None when its shard checks out."""
    shard = shard_result_from_record(record)
    expected = {
        shard.file: (shard.num_bytes, shard.sha256),
        index_filename(shard.file): (shard.index_bytes, shard.index_sha256),
    }
    for name, want in expected.items():
        got = file_digest(FileSystems.join(output_dir, name))
        if got != want:
            return f"{name} is {got or 'missing'}, the done record says {want}"
    if not FileSystems.exists(fragment_path(output_dir, shard.file)):
        return f"the catalog fragment of {shard.file} is missing"
    return None


class _VerifyDoneFn(beam.DoFn):
    def __init__(self, output_dir: str) -> None:
        self._output_dir = output_dir

    def process(self, path: str):
        try:
            record = read_done_record(path)
            problem = _check_done(self._output_dir, record)
        except (ValueError, KeyError, TypeError) as e:
            problem = f"unreadable ({type(e).__name__}: {e})"
        if problem is not None:
            _log.warning(
                "--resume: not trusting %s: %s; that shard is written again", path, problem
            )
            return
        for duplicate in record["duplicates"]:
            yield beam.pvalue.TaggedOutput(DONE_TAG, Duplicate(**duplicate))
        yield shard_result_from_record(record)


class VerifyDoneShards(beam.PTransform):
    """``PBegin -> {"shards": ShardResult, "duplicates": Duplicate}`` for the trusted shards.

    Args:
      output_dir: the dataset directory.
      paths: the done records to check (``list_done_records``), read and checked in parallel.
    """

    def __init__(self, output_dir: str, paths: Sequence[str]) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._paths = list(paths)

    def expand(self, pbegin):
        return (
            pbegin
            | "DoneRecords" >> beam.Create(self._paths)
            | "Spread" >> beam.Reshuffle()
            # str: a done record's path
            | "CheckShard"
            >> beam.ParDo(_VerifyDoneFn(self._output_dir)).with_outputs(DONE_TAG, main="shards")
        )


class StagedFromEarlierAttempts(beam.PTransform):
    """``PBegin -> StagedRecord``: every example an earlier attempt committed to staging.

    Args:
      paths: the sidecars to read (``staging.list_sidecars``), read in parallel.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        super().__init__()
        self._paths = list(paths)

    def expand(self, pbegin):
        return (
            pbegin
            | "Sidecars" >> beam.Create(self._paths)
            | "Spread" >> beam.Reshuffle()
            # str: a sidecar's path
            | "ReadSidecar" >> beam.FlatMap(read_sidecar)
        )


def _pair_by_uri(element):
    # (uri, {"sources": [SourceFile], "staged": [StagedRecord]})
    #   -> SourceFile to prepare, or StagedRecord (reused) on the "reused" output
    _, groups = element
    sources = sorted(groups["sources"])
    # Any staged copy will do: the same source gives the same example bytes. One per listing
    # line, so a URI listed twice stays two inputs, as in an uninterrupted build.
    staged = sorted(groups["staged"], key=lambda r: (r.file, r.offset))
    for i, source in enumerate(sources):
        if i < len(staged):
            yield beam.pvalue.TaggedOutput(REUSED_TAG, staged[i])
        else:
            yield source


class SplitReusable(beam.PTransform):
    """``SourceFile -> {"sources": SourceFile, "reused": StagedRecord}``.

    Joins the inputs with what an earlier attempt staged, by URI: an input with a staged
    example comes out as that ``StagedRecord`` (nothing to read or decode), the others as
    ``SourceFile`` for the image step.

    Args:
      staged: a PCollection of ``StagedRecord`` (``StagedFromEarlierAttempts``).
    """

    def __init__(self, staged) -> None:
        super().__init__()
        self._staged = staged

    def expand(self, sources):
        keyed_sources = sources | "SourceByUri" >> beam.Map(lambda s: (s.uri, s))
        keyed_staged = self._staged | "StagedByUri" >> beam.Map(lambda r: (r.uri, r))
        return (
            {"sources": keyed_sources, "staged": keyed_staged}
            | "JoinByUri" >> beam.CoGroupByKey()
            # (uri, {"sources": [SourceFile], "staged": [StagedRecord]})
            | "Pair" >> beam.FlatMap(_pair_by_uri).with_outputs(REUSED_TAG, main="sources")
        )


def remove_stale_temporaries(output_dir: str) -> int:
    """Deletes the temporaries an interrupted build left beside its outputs; returns how many.

    Every output is written under a hidden temporary name and renamed
    (``objstore.atomic.temporary_path``: ``.<name>.tmp-<hex>``); a build killed between the two
    leaves the temporary behind. A new build starts only once the earlier one is gone, so none
    of them is still being written.
    """
    pattern = FileSystems.join(output_dir, ".*.tmp-*")
    try:
        stale = [m.path for r in FileSystems.match([pattern]) for m in r.metadata_list]
    except BeamIOError:  # an output directory not made yet holds nothing
        return 0
    stale = [path for path in stale if _TEMPORARY.search(path.rsplit("/", 1)[-1])]
    if stale:
        FileSystems.delete(stale)
        _log.info("removed %d temporary file(s) an interrupted build left", len(stale))
    return len(stale)


def remove_staging(output_dir: str) -> int:
    """Deletes ``DST/.staging/`` and everything in it; returns the number of files deleted."""
    root = staging_dir(output_dir)
    # The plan first: while it exists, the staging area is whole and a --resume continues the
    # build; once it is gone, a dataset.json beside it is this build's, complete.
    plan = plan_path(output_dir)
    deleted = 0
    if FileSystems.exists(plan):
        FileSystems.delete([plan])
        deleted = 1
    try:
        matched = FileSystems.match([FileSystems.join(root, "**")])[0].metadata_list
    except Exception:  # nothing there
        matched = []
    paths = sorted(m.path for m in matched)
    for start in range(0, len(paths), _DELETE_BATCH):
        FileSystems.delete(paths[start : start + _DELETE_BATCH])
    if FileSystems.get_scheme(output_dir) in (None, "file"):
        import shutil

        local = root[len("file://") :] if root.startswith("file://") else root
        shutil.rmtree(local, ignore_errors=True)  # the empty directories left behind
    return deleted + len(paths)
