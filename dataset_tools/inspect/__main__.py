"""``python -m dataset_tools.inspect DATASET [--out REPORT_DIR] [--per_class N] [--seed S]
[--fail_on_leakage]``, installed as ``tfrecord-inspect``.

Writes a report on a dataset that a person reads in a browser and a script reads as JSON, in
``REPORT_DIR``: by default ``DATASET-report`` beside a local dataset's directory (not inside it:
the dataset directory is what a build publishes, copies and replaces, and the report is about
it, not part of it). For a dataset on ``s3://`` or ``gs://`` ``--out`` is required: the report
is written to a local directory.

* ``REPORT_DIR/index.html``: one self-contained page (no network, images inline): the counts,
  classes per split with imbalance called out, a seeded contact sheet per class decoded from
  the shards as stored, distributions of source sizes and formats, stored bytes and shard
  sizes, rejected files by reason (thumbnails where the source still opens), exact duplicates
  and label conflicts, and near-duplicate pairs side by side, train-validation leakage first;
* ``REPORT_DIR/contact_sheet.png``: the contact sheets as one image;
* ``REPORT_DIR/stats.json``: every number on the page.

Only the records shown are read, each by its byte range (``dataset_tools.inspect.inspection``), so the
cost hardly grows with the dataset. ``DATASET`` may be local, ``s3://`` or ``gs://``.

Exit status: 0; 1 with ``--fail_on_leakage`` when a validation example has a near-duplicate in
train (for CI gates); 2 when the dataset cannot be read. The last line printed is the report's
path; with leakage, the line before says how to rebuild without it (``--leakage
move_to_train``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from cliflags import plural
from dataset_tools.command import parse_tool_args, run_tool, tool_parser
from dataset_tools.inspect.inspection import gather
from dataset_tools.inspect.report_html import write_report
from schemas import MANIFEST_NAME
from tfrecord_io.source import is_remote, local_path

__all__ = ["main", "default_out"]


def default_out(dataset: str) -> str:
    """Where the report goes without ``--out``: ``DATASET-report`` beside the dataset's
    directory (``out/photos`` -> ``out/photos-report``; ``out/photos/dataset.json`` too).

    Raises:
      ValueError: for a dataset on an object store (``s3://``, ``gs://``), naming ``--out``.
    """
    path = local_path(dataset)
    if is_remote(path):
        raise ValueError(
            f"--out is required for a dataset at {dataset}: the report is written to a local "
            "directory (for example --out report)"
        )
    directory = os.path.abspath(path)
    if os.path.basename(directory) == MANIFEST_NAME:
        directory = os.path.dirname(directory)
    return directory + "-report"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (``dataset_tools.command.run_tool``)."""
    return run_tool(lambda: _main(argv), unfinished="the report may be incomplete")


def _main(argv: Sequence[str] | None) -> int:
    parser = tool_parser(
        "dataset_tools.inspect",
        "Write an HTML report of a dataset: samples, classes, rejects, leakage.",
    )
    parser.add_argument("dataset", help="dataset directory or URI holding dataset.json")
    parser.add_argument(
        "--out",
        help="local directory for the report (default: DATASET-report beside the dataset; "
        "required for s3:// and gs://)",
    )
    parser.add_argument(
        "--per_class", type=int, default=16, help="examples per class in the contact sheets (16)"
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (0)")
    parser.add_argument(
        "--fail_on_leakage",
        action="store_true",
        help="exit 1 when a validation example has a near-duplicate in train",
    )
    args = parse_tool_args(parser, argv)
    if args.per_class < 1:
        parser.error(f"--per_class must be >= 1, got {args.per_class}")
    try:
        out = args.out if args.out is not None else default_out(args.dataset)
    except ValueError as e:
        parser.error(str(e))
    try:
        report = gather(args.dataset, per_class=args.per_class, seed=args.seed)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot report on {args.dataset}: {e}", file=sys.stderr)
        return 2
    paths = write_report(report, out)
    near = report.stats["near_duplicates"]
    counts = report.stats["counts"]
    print(
        f"{plural(counts['written'], 'example', grouped=True)} in "
        f"{plural(len(report.stats['label_names']), 'class', 'classes')}; "
        f"{counts['rejected']:,} rejected ({counts['too_small']:,} too small), "
        f"{plural(counts['duplicates'], 'duplicate', grouped=True)}, "
        f"{counts['upscaled']:,} upscaled; "
        f"{plural(near['pairs'], 'near-duplicate pair', grouped=True)} "
        f"({near['leakage']:,} train-validation leakage)"
    )
    failed = args.fail_on_leakage and near["leakage"]
    if near.get("remedy") and not failed:
        print(f"leakage: {near['remedy']}")
    print(f"report: {os.path.abspath(paths['html'])}")
    if failed:
        print(
            f"FAILED: {plural(near['leakage'], 'train-validation leakage pair', grouped=True)} "
            f"(a validation example with a near-duplicate in train, within {near['threshold']} "
            "bits); see the report's near-duplicates section"
            + (f"; to fix, {near['remedy']}" if near.get("remedy") else ""),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
