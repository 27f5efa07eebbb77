"""``python -m dataset_tools.verify DATASET [--deep] [--json] [--no-progress] [--key K ...]``,
installed as ``tfrecord-verify``.

Checks every shard of a dataset against its ``dataset.json``, and its index files and catalogs
against the shards; see ``dataset_tools.verify.verification``. A glob of shards without
``dataset.json`` gets the checks that need none (CRCs, parsing, counts). ``--key K`` checks only
the examples with those keys, reading each one's byte range (``tfrecord_io.random_access``).
Exit status: 0 if everything holds, 1 if any check failed (each failure names its shard), 2 if
the dataset cannot be read at all.
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
from collections.abc import Sequence

from cliflags import plural
from dataset_tools.command import parse_tool_args, run_tool, tool_parser
from dataset_tools.verify.report import VerifyReport
from dataset_tools.verify.verification import verify_dataset, verify_keys
from schemas.lineage import LATEST_NAME
from tfrecord_io.source import manifest_path

__all__ = ["main"]


def _headline(problems: list[str]) -> str:
    """The problem that explains a shard's others: a damaged or missing record first."""
    for problem in problems:
        if problem.startswith(("missing", "record ")):
            return problem
    return problems[0]


def _print_human(report: VerifyReport) -> None:
    if not report.manifest_found:
        print(
            f"no dataset.json found for {report.dataset}: checked CRCs, parsing and record "
            "counts only (python -m dataset_tools.adopt describes the shards for full checks)"
        )
    for shard in report.shards:
        records = "-" if shard.num_records is None else str(shard.num_records)
        expected = f"/{shard.expected_examples}" if report.manifest_found else ""
        if shard.ok:
            print(f"OK   {shard.file}  records={records}{expected}")
            continue
        # One line per damaged shard: which one, where, what; the rest follows from it.
        first, more = _headline(shard.problems), len(shard.problems) - 1
        print(
            f"FAIL {shard.file}  records={records}{expected}: {first}"
            + (f" (+{more} more; --json lists them)" if more else "")
        )
    for problem in report.problems:
        print(f"FAIL dataset: {problem}")
    failed = len(report.failed_shards)
    verdict = "OK" if report.ok else "FAILED"
    print(
        f"{verdict}: {len(report.shards) - failed}/{len(report.shards)} shards sound, "
        f"{plural(report.num_records, 'record')} checked"
        f"{' and decoded' if report.deep else ''}"
    )


def _verify_keys(dataset: str, keys: list[str], *, as_json: bool) -> int:
    try:
        problems = verify_keys(dataset, keys)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if as_json:
        print(
            json.dumps({"dataset": dataset, "ok": not problems, "keys": keys, "problems": problems})
        )
    else:
        for key in keys:
            mine = [p for p in problems if p.startswith(f"key {key}")]
            print(f"{'FAIL' if mine else 'OK  '} key {key}")
            for problem in mine:
                print(f"     {problem}")
        print(f"{'FAILED' if problems else 'OK'}: {plural(len(keys), 'key')} checked by byte range")
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (``dataset_tools.command.run_tool``)."""
    return run_tool(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = tool_parser(
        "dataset_tools.verify", "Verify a dataset's shards against its dataset.json."
    )
    parser.add_argument(
        "dataset",
        help="dataset directory or URI holding dataset.json, or a quoted glob of shards "
        "without one (CRCs, parsing and counts only)",
    )
    parser.add_argument("--deep", action="store_true", help="also decode every image")
    parser.add_argument("--json", action="store_true", help="print a machine-readable report")
    parser.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    parser.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="K",
        help="check only the example with key K (repeatable): found in the catalog, read by "
        "its byte range, intact and holding that key",
    )
    args = parse_tool_args(parser, argv)
    if args.key:
        return _verify_keys(args.dataset, args.key, as_json=args.json)
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
    followed = _version_followed(args.dataset)
    if args.json:
        # A shard's report at a time: every shard is listed without holding every report.
        for chunk in report.json_chunks(checked=followed or args.dataset):
            sys.stdout.write(chunk)
        sys.stdout.write("\n")
    else:
        if followed:
            given = args.dataset.rstrip("/")
            pointer = (
                given if posixpath.basename(given) == LATEST_NAME else f"{given}/{LATEST_NAME}"
            )
            print(f"checked {followed}: the version {pointer} names")
        _print_human(report)
    return 0 if report.ok else 1


def _version_followed(dataset: str) -> str | None:
    """The version directory a ``latest`` pointer led to, when ``dataset`` is a versions root
    (or the pointer itself); None when it is the dataset itself or a glob of shards."""
    found = manifest_path(dataset)
    if found is None:
        return None
    directory = posixpath.dirname(found)
    given = dataset.rstrip("/")
    if given in (directory, found) or os.path.abspath(given) == os.path.abspath(directory):
        return None
    return directory


if __name__ == "__main__":
    sys.exit(main())
