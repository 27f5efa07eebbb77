"""``python -m dataset_tools.inspect DATASET --out REPORT_DIR [--per_class N] [--seed S]
[--fail_on_leakage]``, installed as ``tfrecord-inspect``.

Writes a report on a dataset that a person reads in a browser and a script reads as JSON:

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
train (for CI gates); 2 when the dataset cannot be read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from dataset_tools.command import parse_tool_args, run_tool, tool_parser
from dataset_tools.inspect.inspection import gather
from dataset_tools.inspect.report_html import write_report

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (``dataset_tools.command.run_tool``)."""
    return run_tool(lambda: _main(argv), unfinished="the report may be incomplete")


def _main(argv: Sequence[str] | None) -> int:
    parser = tool_parser(
        "dataset_tools.inspect",
        "Write an HTML report of a dataset: samples, classes, rejects, leakage.",
    )
    parser.add_argument("dataset", help="dataset directory or URI holding dataset.json")
    parser.add_argument("--out", required=True, help="local directory for the report")
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
        report = gather(args.dataset, per_class=args.per_class, seed=args.seed)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot report on {args.dataset}: {e}", file=sys.stderr)
        return 2
    paths = write_report(report, args.out)
    near = report.stats["near_duplicates"]
    counts = report.stats["counts"]
    print(
        f"{counts['written']:,} examples in {len(report.stats['label_names'])} classes; "
        f"{counts['rejected']:,} rejected ({counts['too_small']:,} too small), "
        f"{counts['duplicates']:,} duplicates, {counts['upscaled']:,} upscaled; "
        f"{near['pairs']:,} near-duplicate pairs, {near['leakage']:,} train-validation leakage"
    )
    print(f"report: {os.path.abspath(paths['html'])}")
    if args.fail_on_leakage and near["leakage"]:
        print(
            f"FAILED: {near['leakage']} validation example(s) have a near-duplicate in train "
            f"(within {near['threshold']} bits); see the report's near-duplicates section, or "
            "rebuild with --leakage move_to_train",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
