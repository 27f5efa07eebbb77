"""Images -> deterministic TFRecord shards + ``dataset.json``.

Usage::

  python -m beam_pipelines.images_to_tfrecord --input SRC --output DST [options] [Beam options]

``SRC`` is a directory or prefix laid out as ``<class name>/<image file>``, or a ``.csv`` /
``.jsonl`` listing of ``uri,label``. Every Beam pipeline option (``--runner``,
``--direct_num_workers``, ``--direct_running_mode``…) passes through untouched.

Exit status: 0 when the dataset is published; 1 when more than ``--max_bad_fraction`` of the
inputs were rejected (the report is written, ``dataset.json`` is not); 2 for a usage error,
including an existing dataset at ``DST`` without ``--overwrite`` (nothing is changed then);
3 when the job itself failed (``JOB_FAILED``: a storage error, a bad listing line, a bug; no
input image can cause it, since per-image failures are rejections), with nothing published.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import shlex
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineResult

from beam_pipelines.builds.base_splits import BaseSplitsSpec, base_splits_spec
from beam_pipelines.builds.incremental import BaseDataset, lineage_block, open_base
from beam_pipelines.builds.resume import (
    ResumeState,
    published_by_earlier_attempt,
    remove_staging,
    start_build,
    summary_of_published,
)
from beam_pipelines.command_line import parse_command_line
from beam_pipelines.config import (
    ImagesToTFRecordOptions,
    PipelineConfig,
    config_from_options,
    resolve_image_threads,
    resolve_search,
)
from beam_pipelines.engines.runners import (
    FLINK_RUNNER,
    SPARK_RUNNER,
    cancel_job,
    in_process_runner,
    private_temp_dir,
    resolve_runner_aliases,
)
from beam_pipelines.graph.plan import plan_path
from beam_pipelines.graph.transforms import ImagesToShards
from beam_pipelines.image.colour import COLOUR_SPACE
from beam_pipelines.inputs.listing_ranges import estimate_records
from beam_pipelines.inputs.sources import is_listing
from beam_pipelines.interrupts import interrupted_line
from beam_pipelines.output.catalog_io import (
    remove_staged_fragments,
    remove_unlisted_catalog_files,
    write_tfds_metadata,
)
from beam_pipelines.output.publish import (
    StagedResult,
    StageResults,
    build_manifest,
    prepare_output,
    publish_manifest,
    read_staged,
    remove_unlisted_shards,
)
from beam_pipelines.output.shards import METRICS_NAMESPACE, TRAIN, VALIDATION, fixed_shard_counts
from beam_pipelines.progress import ProgressSpec, close_reporter
from beam_pipelines.summary import TOP_REASONS, RunSummary
from cliflags import command_name, plural
from cliflags.interrupts import Caught, Interrupted, catch_interrupts
from schemas.manifest import REJECTED_NAME, TOOL_VERSION, ImageSpec, Manifest

__all__ = [
    "ImagesToTFRecordOptions",
    "JOB_FAILED",
    "JobFailedError",
    "RunSummary",
    "config_from_options",
    "publish_anyway_command",
    "publish_anyway_fraction",
    "run",
    "main",
]

JOB_FAILED = 3  # exit status when the job itself failed (1 is the bad-fraction refusal)

# Multi-process DirectRunner workers forward their logs through this logger. Two start-up
# warnings are expected and harmless: workers do not know our flags, and have no staging dir.
_WORKER_LOGGER = "apache_beam.runners.portability.local_job_service"
_WORKER_NOISE = ("Discarding unparseable args", "No semi_persistent_directory found")


def _drop_worker_startup_noise(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not any(noise in message for noise in _WORKER_NOISE)


def _counters(result) -> dict[str, int]:
    counters = result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]
    values: dict[str, int] = {}
    for counter in counters:
        value = counter.committed if counter.committed is not None else counter.attempted
        name = counter.key.metric.name
        values[name] = values.get(name, 0) + int(value or 0)
    return dict(sorted(values.items()))


def _check_input(config: PipelineConfig) -> None:
    """Refuses an ``--input`` with nothing to read, before any work, saying which case it is.

    Raises:
      ValueError: if the listing or folder does not exist, or the folder holds no file.
    """
    if is_listing(config.input):
        if not FileSystems.exists(config.input):
            raise ValueError(f"--input listing {config.input!r} does not exist")
        return
    root = config.input.rstrip("/") or config.input
    found = FileSystems.match([FileSystems.join(root, "**")], limits=[1])[0].metadata_list
    if found:
        return
    try:
        # On an object store a prefix with no object under it does not exist either.
        exists = FileSystems.exists(root)
    except Exception:  # each FileSystem reports "nothing there" its own way
        exists = False
    if not exists:
        raise ValueError(
            f"--input {config.input!r} does not exist; expected a folder holding "
            "<class name>/<image file>, or a .csv or .jsonl listing"
        )
    raise ValueError(
        f"--input {config.input!r} holds no files; expected <class name>/<image file> under it"
    )


def _listed_inputs(config: PipelineConfig, options: PipelineOptions) -> int | None:
    """About how many inputs a listing names, for a build on a distributed runner (what sizes
    its search and its engine's tasks); None in-process, or for a directory (its size is
    known only once the job lists it)."""
    if in_process_runner(options) is not None or not is_listing(config.input):
        return None
    with contextlib.suppress(OSError):  # the job reads it, and names what is wrong
        return estimate_records(config.input)
    return None


def _choose_search(
    config: PipelineConfig, options: PipelineOptions, listed: int | None
) -> PipelineConfig:
    """``--near_duplicate_search auto`` made a method, from the listing's size and the runner;
    says so only when that is the bucketed search (the gathered one is what it always was)."""
    in_process = in_process_runner(options) is not None
    resolved = resolve_search(config, listed_inputs=listed, in_process=in_process)
    if config.near_duplicate_search == "auto" and resolved.near_duplicate_search == "bucketed":
        logging.getLogger(__name__).info(
            "near-duplicate search: bucketed over the workers (--near_duplicate_search auto: "
            "the listing names about %s inputs; --near_duplicate_search gathered searches them "
            "in one worker)",
            f"{listed:,}",
        )
    return resolved


def _size_engine_tasks(options: PipelineOptions, listed: int | None) -> None:
    """Sizes Flink's tasks or Spark's partitions for a listing's inputs, in place: Beam's
    runners on both hold a task's whole partition at once (docs/scale.md)."""
    if listed is None:
        return
    runner = options.view_as(StandardOptions).runner
    if runner == FLINK_RUNNER:
        from beam_pipelines.engines import flink  # only for a Flink run

        flink.size_parallelism(options, listed)
    elif runner == SPARK_RUNNER:
        from beam_pipelines.engines import spark  # only for a Spark run

        spark.size_partitions(options, listed)


def _in_this_process(options: PipelineOptions) -> bool:
    """Whether the image step runs in this process: the in-process runner, not its worker
    processes."""
    runner = options.view_as(StandardOptions).runner
    mode = options.view_as(DirectOptions).direct_running_mode
    return runner in (None, "DirectRunner", "PrismRunner") and mode != "multi_processing"


def _one_process(options: PipelineOptions) -> bool:
    """Whether the image step runs in this process alone: in it, with one worker."""
    workers = options.view_as(DirectOptions).direct_num_workers or 1
    return _in_this_process(options) and workers <= 1


def _progress_mode(progress: str, options: PipelineOptions) -> str:
    # A bar only where the image step runs in this process (the DirectRunner's default modes)
    # and standard error is a terminal; log lines everywhere else.
    if progress != "auto":
        return progress
    return "bar" if _in_this_process(options) and sys.stderr.isatty() else "log"


def publish_anyway_fraction(bad_fraction: float) -> float:
    """The ``--max_bad_fraction`` that publishes a build with ``bad_fraction``: the fraction
    rounded up to a whole percent (2.75 % -> 0.03), so the command shown is short and exact."""
    # The small tolerance keeps an exact percent (0.03 from 3 of 100) from rounding up again.
    return min(math.ceil(bad_fraction * 100 - 1e-9) / 100, 1.0)


def publish_anyway_command(argv: Sequence[str], fraction: float) -> str:
    """The user's command with ``--resume --max_bad_fraction fraction``: it publishes the
    refused build from its staging area without preparing any image again."""
    kept: list[str] = []
    skip_value = False
    for token in argv:
        if skip_value:
            skip_value = False
        elif token == "--max_bad_fraction":
            skip_value = True
        elif not token.startswith(("--max_bad_fraction=", "--resume")):
            kept.append(token)
    # The command's name may be two words (python -m ...); only the user's arguments are quoted.
    return (
        f"{command_name('beam_pipelines.images_to_tfrecord')} {shlex.join(kept)} "
        f"--resume --max_bad_fraction {fraction:g}"
    )


def _bad_fraction_refusal(staged: StagedResult, config: PipelineConfig, argv: Sequence[str]) -> str:
    reasons = sorted(
        ((reason, n) for reason, n in staged.rejected_by_reason.items() if reason != "no_label"),
        key=lambda kv: (-kv[1], kv[0]),
    )
    top = ", ".join(f"{reason} {n}" for reason, n in reasons[:TOP_REASONS])
    more = f" (+{len(reasons) - TOP_REASONS} more)" if len(reasons) > TOP_REASONS else ""
    bad = staged.rejected - staged.no_label
    rejected = FileSystems.join(config.output, REJECTED_NAME)
    command = publish_anyway_command(argv, publish_anyway_fraction(staged.bad_fraction))
    return (
        f"bad fraction {staged.bad_fraction:.2%} is above --max_bad_fraction "
        f"{config.max_bad_fraction} ({bad} of {plural(staged.input - staged.no_label, 'file')} in "
        f"class folders rejected: {top}{more}); each file and why: {rejected}\n"
        "  the prepared images are kept: to publish this build anyway, without preparing any "
        f"image again, run\n    {command}"
    )


def _empty_build_refusal(staged: StagedResult, config: PipelineConfig) -> str:
    """Why a build that would write no example is not published, and what to do instead."""
    rejected = FileSystems.join(config.output, REJECTED_NAME)
    if staged.input == 0:
        return f"--input {config.input} gave no input file (hidden and system files are skipped)"
    if staged.no_label == staged.input:
        if is_listing(config.input):
            return (
                f"no line of the listing --input {config.input} has a label: give each image "
                'its class, uri,label (.csv) or {"uri": ..., "label": ...} (.jsonl)'
            )
        return (
            f"no class folders under --input {config.input} ({plural(staged.input, 'file')} "
            "directly in it): put each class's images in a folder of its own, "
            "--input DIR/<class>/<file>; or give a .csv/.jsonl listing of uri,label"
        )
    return (
        f"no example to write: all {plural(staged.input, 'input')} were rejected "
        f"({_reason_counts(staged)}); each file and why: {rejected}"
    )


def _reason_counts(staged: StagedResult) -> str:
    reasons = sorted(staged.rejected_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    more = f" (+{len(reasons) - TOP_REASONS} more)" if len(reasons) > TOP_REASONS else ""
    return ", ".join(f"{reason} {n}" for reason, n in reasons[:TOP_REASONS]) + more


def _publish_blockers(
    staged: StagedResult, config: PipelineConfig, argv: Sequence[str]
) -> list[str]:
    """Why the dataset must not be published, one entry per gate that failed; each says what
    to run instead. A build that would write no example is never published: its one entry
    says why (publishing it anyway would only move the failure to the reader or trainer)."""
    if staged.written == 0:
        return [_empty_build_refusal(staged, config)]
    blockers = []
    if staged.bad_fraction > config.max_bad_fraction:
        blockers.append(_bad_fraction_refusal(staged, config, argv))
    if staged.label_conflicts and config.label_conflicts == "fail":
        blockers.append(
            f"label conflicts ({len(staged.label_conflicts)}) and --label_conflicts fail; fix "
            "the labels, or pass --label_conflicts keep_first or drop_both"
        )
    return blockers


class JobFailedError(RuntimeError):
    """The pipeline itself failed (not an input image: those are rejections)."""


def _open_base(config: PipelineConfig, content: dict[str, Any]) -> BaseDataset | None:
    """The ``--base`` dataset, opened (and refused, naming the problem) before anything is
    written; when its image options differ it says so and nothing is reused.

    Raises:
      ValueError: if the base cannot be used, or is ``--output`` through its latest pointer.
    """
    if config.base is None:
        return None
    base = open_base(config.base, options=content, tool_version=TOOL_VERSION)
    if base.root.rstrip("/") == config.output.rstrip("/"):
        raise ValueError(
            f"--base {config.base} is --output {config.output} (through its latest "
            "pointer): the base is never modified; write the new version beside it"
        )
    return base


def _run_pipeline(
    config: PipelineConfig,
    options: PipelineOptions,
    spec: ProgressSpec,
    resume: ResumeState,
    base: BaseDataset | None,
    base_splits: BaseSplitsSpec | None = None,
) -> PipelineResult:
    """Builds and runs the Beam pipeline to its end; returns its result (for the counters).

    Raises:
      JobFailedError: if the pipeline failed while running.
    """
    # Beam's launcher leaves directories in the temp dir on every run; they go with this one.
    with private_temp_dir():
        pipeline = beam.Pipeline(runner=in_process_runner(options), options=options)
        results = pipeline | "ImagesToShards" >> ImagesToShards(
            config,
            spec,
            resume=resume,
            base=base.spec if base and base.reusable else None,
            base_splits=base_splits,
        )
        _ = results | "StageResults" >> StageResults(config.output, spec.run_id)
        try:
            result = pipeline.run()
            try:
                result.wait_until_finish()
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the engine's job ends too
                cancel_job(result)
                raise
        except Exception as e:  # runners re-raise a step's own exception type
            raise JobFailedError(f"the pipeline failed: {type(e).__name__}: {e}") from e
        finally:
            close_reporter(spec.run_id)
    return result


def _manifest(
    config: PipelineConfig, staged: StagedResult, metrics: dict[str, int], base: BaseDataset | None
) -> Manifest:
    """The dataset's manifest from what the run staged, with its lineage for a ``--base`` build."""
    image = config.image
    manifest = build_manifest(
        staged,
        image=ImageSpec(
            encoding=image.encoding,
            image_size=image.image_size,
            crop=image.crop,
            color_space=COLOUR_SPACE,
        ),
        options=config.manifest_options(),
        splits=(TRAIN, VALIDATION) if config.validation_fraction > 0 else (TRAIN,),
    )
    if base is None:
        return manifest
    reused, prepared = metrics.get("images_reused", 0), metrics.get("images_prepared", 0)
    return dataclasses.replace(
        manifest, lineage=lineage_block(base, reused=reused, prepared=prepared)
    )


def _publish(output: str, manifest: Manifest, old_manifest: Manifest | None) -> list[str]:
    """Publishes the dataset (``dataset.json`` last but for the clean-up); returns the files
    of the dataset it replaced that it removed."""
    write_tfds_metadata(output, manifest)
    publish_manifest(output, manifest)
    removed = remove_unlisted_shards(output, manifest, old_manifest)
    removed += remove_unlisted_catalog_files(output, manifest)
    remove_staged_fragments(output, manifest)
    remove_staging(output)  # kept after a failure or a refusal, for --resume
    return removed


def run(argv: Sequence[str] | None = None, *, progress: str | None = None) -> RunSummary:
    """Runs the pipeline; publishes ``dataset.json`` unless a quality gate fails.

    Args:
      argv: command-line arguments (default ``sys.argv[1:]``): ours, then Beam's pipeline
        options; a flag neither knows exits with status 2 (``SystemExit``) before any work.
      progress: ``bar``, ``log`` or ``off``; ``auto`` shows a bar when the image step runs in
        this process and standard error is a terminal, else log lines. Default: ``--progress``.

    Returns:
      The run's summary; ``summary.published`` says whether the dataset was published.

    Raises:
      ValueError: for bad flags or input.
      OutputExistsError: if ``--output`` holds a dataset and ``--overwrite`` was not given.
      JobFailedError: if the pipeline failed while running.
    """
    started = time.monotonic()
    args, pipeline_argv = parse_command_line(sys.argv[1:] if argv is None else argv)
    options = PipelineOptions(resolve_runner_aliases(pipeline_argv))
    # The checks below list s3:// and gs:// paths before any Pipeline exists, and Beam gives
    # FileSystems its options (--s3_* endpoint and credentials) only when one is built.
    FileSystems.set_options(options)
    config = config_from_options(options)
    _check_input(config)
    listed = _listed_inputs(config, options)
    config = _choose_search(config, options, listed)
    _size_engine_tasks(options, listed)
    config = resolve_image_threads(config, one_process=_one_process(options))
    content = config.manifest_options()
    base = _open_base(config, content)
    # With --stratify_validation the base's examples keep their split: checked now.
    base_splits = base_splits_spec(
        base, stratify=config.stratify_validation, validation_fraction=config.validation_fraction
    )
    if config.resume and (done := published_by_earlier_attempt(config.output, content)):
        # Killed after publishing: nothing left to do but tidy up.
        return summary_of_published(config.output, done, time.monotonic() - started)
    # A resumed build may have published already (its plan is still there): it publishes again.
    resuming = config.resume and FileSystems.exists(plan_path(config.output))
    old_manifest = prepare_output(config.output, overwrite=config.overwrite or resuming)
    fixed = None
    if config.num_shards is not None:
        fixed = fixed_shard_counts(config.num_shards, config.validation_fraction)
    resume = start_build(config.output, content, resume=config.resume, fixed_counts=fixed)
    run_id = uuid.uuid4().hex
    spec = ProgressSpec(run_id, _progress_mode(progress or args.progress, options))
    result = _run_pipeline(config, options, spec, resume, base, base_splits)

    staged = read_staged(config.output, run_id)
    metrics = _counters(result)
    manifest = _manifest(config, staged, metrics, base)
    blockers = _publish_blockers(staged, config, list(sys.argv[1:] if argv is None else argv))
    removed = [] if blockers else _publish(config.output, manifest, old_manifest)
    # Inputs neither prepared nor rejected nor taken from a --base came from staging.
    from_staging = None
    if config.resume:
        taken = metrics.get("images_prepared", 0) + metrics.get("images_reused", 0)
        from_staging = max(staged.input - staged.rejected - taken, 0)
    return RunSummary(
        output=config.output,
        published=not blockers,
        manifest=manifest,
        bad_fraction=staged.bad_fraction,
        rejected_by_reason=staged.rejected_by_reason,
        metrics=metrics,
        removed=tuple(removed),
        elapsed_s=time.monotonic() - started,
        skipped_examples=tuple(staged.skipped_examples),
        label_conflicts=tuple(staged.label_conflicts),
        near_duplicates=staged.near_duplicates,
        not_published_because=tuple(blockers),
        reused_from_staging=from_staging,
    )


def _failure_status(e: Exception) -> int:
    """Prints why the run failed; returns the exit status for it."""
    if isinstance(e, JobFailedError):
        print(f"error: {e}; nothing was published", file=sys.stderr)
        return JOB_FAILED
    if isinstance(e, ValueError):  # includes OutputExistsError
        print(f"error: {e}", file=sys.stderr)
        return 2
    # The job's own failure, e.g. writing dataset.json.
    logging.getLogger(__name__).exception("the job failed")
    print(f"error: the job failed: {type(e).__name__}: {e}", file=sys.stderr)
    return JOB_FAILED


def _run_and_report(argv: list[str], as_json: bool, caught: Caught) -> int:
    try:
        summary = run(argv)
    except Exception as e:
        if caught.signum is not None:
            # A runner re-raised the interrupt as a step's failure (RuntimeError): it is one.
            raise Interrupted(caught.signum) from e
        return _failure_status(e)
    print(json.dumps(summary.to_dict(), indent=2) if as_json else summary.describe())
    return 0 if summary.published else 1


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: runs, prints the summary (``--json``: as JSON), returns the exit status.

    SIGINT (Ctrl-C) and SIGTERM stop the run with one line saying what was kept and the
    ``--resume`` command that continues it, and status 130 or 143; nothing is published then.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args, _ = parse_command_line(argv)  # --help, or a flag nobody knows: exits here
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger(_WORKER_LOGGER).addFilter(_drop_worker_startup_noise)
    logging.getLogger("beam_pipelines.progress").setLevel(logging.INFO)
    logging.getLogger("beam_pipelines.engines").setLevel(logging.INFO)  # engine job id and UI
    logging.getLogger("beam_pipelines.builds.resume").setLevel(logging.INFO)  # what --resume takes
    # The search --near_duplicate_search auto chose, when it is the bucketed one.
    logging.getLogger(__name__).setLevel(logging.INFO)
    with catch_interrupts() as caught:
        try:
            return _run_and_report(argv, args.json, caught)
        except KeyboardInterrupt:
            if caught.signum is None:
                raise  # not a signal this command handles
        print(interrupted_line(caught.signum, args.output, argv), file=sys.stderr)
        return caught.exit_status


if __name__ == "__main__":
    sys.exit(main())
