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

import dataclasses
import json
import logging
import sys
import time
import uuid
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beam_pipelines.base import lineage_block, open_base
from beam_pipelines.catalog_io import (
    remove_staged_fragments,
    remove_unlisted_catalog_files,
    write_tfds_metadata,
)
from beam_pipelines.command_line import parse_command_line
from beam_pipelines.config import ImagesToTFRecordOptions, PipelineConfig, config_from_options
from beam_pipelines.image_colour import COLOUR_SPACE
from beam_pipelines.plan import plan_path
from beam_pipelines.progress import ProgressSpec, close_reporter
from beam_pipelines.publish import (
    StagedResult,
    StageResults,
    build_manifest,
    prepare_output,
    publish_manifest,
    read_staged,
    remove_unlisted_shards,
)
from beam_pipelines.resume import (
    published_by_earlier_attempt,
    remove_staging,
    start_build,
    summary_of_published,
)
from beam_pipelines.runners import in_process_runner, private_temp_dir, resolve_runner_aliases
from beam_pipelines.shards import METRICS_NAMESPACE, TRAIN, VALIDATION, fixed_shard_counts
from beam_pipelines.sources import is_listing
from beam_pipelines.summary import RunSummary
from beam_pipelines.transforms import ImagesToShards
from schemas.manifest import TOOL_VERSION, ImageSpec

__all__ = [
    "ImagesToTFRecordOptions",
    "JOB_FAILED",
    "JobFailedError",
    "RunSummary",
    "config_from_options",
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
    if is_listing(config.input):
        if not FileSystems.exists(config.input):
            raise ValueError(f"--input listing {config.input!r} does not exist")
        return
    pattern = FileSystems.join(config.input.rstrip("/"), "**")
    found = FileSystems.match([pattern], limits=[1])[0].metadata_list
    if not found:
        raise ValueError(
            f"--input {config.input!r} holds no files; expected <class name>/<image file> under it"
        )


def _progress_mode(progress: str, options: PipelineOptions) -> str:
    # A bar only where the image step runs in this process (the DirectRunner's default modes)
    # and standard error is a terminal; log lines everywhere else.
    if progress != "auto":
        return progress
    runner = options.view_as(StandardOptions).runner
    mode = options.view_as(DirectOptions).direct_running_mode
    in_process = runner in (None, "DirectRunner", "PrismRunner") and mode != "multi_processing"
    return "bar" if in_process and sys.stderr.isatty() else "log"


def _publish_blockers(staged: StagedResult, config: PipelineConfig) -> list[str]:
    """Why the dataset must not be published, one line per gate that failed."""
    blockers = []
    if staged.bad_fraction > config.max_bad_fraction:
        blockers.append(
            f"bad fraction {staged.bad_fraction:.2%} is above --max_bad_fraction "
            f"{config.max_bad_fraction}; see the rejected report"
        )
    if staged.label_conflicts and config.label_conflicts == "fail":
        blockers.append(
            f"label conflicts ({len(staged.label_conflicts)}) and --label_conflicts fail; fix "
            "the labels, or pass --label_conflicts keep_first or drop_both"
        )
    return blockers


class JobFailedError(RuntimeError):
    """The pipeline itself failed (not an input image: those are rejections)."""


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
    progress = progress or args.progress
    options = PipelineOptions(resolve_runner_aliases(pipeline_argv))
    # The checks below list s3:// and gs:// paths before any Pipeline exists, and Beam gives
    # FileSystems its options (--s3_* endpoint and credentials) only when one is built.
    FileSystems.set_options(options)
    config = config_from_options(options)
    _check_input(config)
    content = config.manifest_options()
    # Opened (and refused, naming the problem) before anything is written; when its image
    # options differ it says so and nothing is reused.
    base = None
    if config.base is not None:
        base = open_base(config.base, options=content, tool_version=TOOL_VERSION)
        if base.root.rstrip("/") == config.output.rstrip("/"):
            raise ValueError(
                f"--base {config.base} is --output {config.output} (through its latest "
                "pointer): the base is never modified; write the new version beside it"
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
    spec = ProgressSpec(run_id, _progress_mode(progress, options))

    # Beam's launcher leaves directories in the temp dir on every run; they go with this one.
    with private_temp_dir():
        pipeline = beam.Pipeline(runner=in_process_runner(options), options=options)
        results = pipeline | "ImagesToShards" >> ImagesToShards(
            config, spec, resume=resume, base=base.spec if base and base.reusable else None
        )
        _ = results | "StageResults" >> StageResults(config.output, run_id)
        try:
            result = pipeline.run()
            result.wait_until_finish()
        except Exception as e:  # runners re-raise a step's own exception type
            raise JobFailedError(f"the pipeline failed: {type(e).__name__}: {e}") from e
        finally:
            close_reporter(run_id)

    staged = read_staged(config.output, run_id)
    splits = (TRAIN, VALIDATION) if config.validation_fraction > 0 else (TRAIN,)
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
        splits=splits,
    )
    metrics = _counters(result)
    if base is not None:
        reused, prepared = metrics.get("images_reused", 0), metrics.get("images_prepared", 0)
        manifest = dataclasses.replace(
            manifest, lineage=lineage_block(base, reused=reused, prepared=prepared)
        )
    blockers = _publish_blockers(staged, config)
    published = not blockers
    removed: list[str] = []
    if published:
        write_tfds_metadata(config.output, manifest)
        publish_manifest(config.output, manifest)
        removed = remove_unlisted_shards(config.output, manifest, old_manifest)
        removed += remove_unlisted_catalog_files(config.output, manifest)
        remove_staged_fragments(config.output, manifest)
        remove_staging(config.output)  # kept after a failure or a refusal, for --resume
    return RunSummary(
        output=config.output,
        published=published,
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
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: runs, prints the summary (``--json``: as JSON), returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, _ = parse_command_line(argv)  # --help, or a flag nobody knows: exits here
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger(_WORKER_LOGGER).addFilter(_drop_worker_startup_noise)
    logging.getLogger("beam_pipelines.progress").setLevel(logging.INFO)
    logging.getLogger("beam_pipelines.engines").setLevel(logging.INFO)  # engine job id and UI
    try:
        summary = run(argv)
    except JobFailedError as e:
        print(f"error: {e}; nothing was published", file=sys.stderr)
        return JOB_FAILED
    except ValueError as e:  # includes OutputExistsError
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the job's own failure, e.g. writing dataset.json
        logging.getLogger(__name__).exception("the job failed")
        print(f"error: the job failed: {type(e).__name__}: {e}", file=sys.stderr)
        return JOB_FAILED
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.describe())
    return 0 if summary.published else 1


if __name__ == "__main__":
    sys.exit(main())
