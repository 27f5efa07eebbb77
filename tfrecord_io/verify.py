"""``python -m tfrecord_io.verify DATASET [--deep] [--json] [--no-progress]``, installed as
``tfrecord-verify``.

Checks every shard of a dataset against its ``dataset.json``; see ``tfrecord_io.verification``.
Exit status: 0 if everything holds, 1 if any check failed (each failure names its shard), 2 if
the dataset cannot be read at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from tfrecord_io.verification import VerifyReport, verify_dataset

__all__ = ["main"]


def _print_human(report: VerifyReport) -> None:
    for shard in report.shards:
        status = "OK  " if shard.ok else "FAIL"
        records = "-" if shard.num_records is None else str(shard.num_records)
        print(f"{status} {shard.file}  records={records}/{shard.expected_examples}")
        for problem in shard.problems:
            print(f"     {shard.file}: {problem}")
    for problem in report.problems:
        print(f"FAIL dataset: {problem}")
    failed = len(report.failed_shards)
    verdict = "OK" if report.ok else "FAILED"
    print(
        f"{verdict}: {len(report.shards) - failed}/{len(report.shards)} shards sound, "
        f"{sum(s.num_records or 0 for s in report.shards)} records checked"
        f"{' and decoded' if report.deep else ''}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m tfrecord_io.verify",
        description="Verify a dataset's shards against its dataset.json.",
    )
    parser.add_argument("dataset", help="dataset directory or URI holding dataset.json")
    parser.add_argument("--deep", action="store_true", help="also decode every image")
    parser.add_argument("--json", action="store_true", help="print a machine-readable report")
    parser.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    args = parser.parse_args(argv)
    # TensorFlow's C++ start-up banner would bury the report; the caller may still override.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        report = verify_dataset(
            args.dataset,
            deep=args.deep,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    except (OSError, ValueError) as e:  # includes object-store errors, which name the URI
        if args.json:
            print(json.dumps({"dataset": args.dataset, "ok": False, "error": str(e)}))
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_human(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
