"""Dataset versions side by side, and the ``latest`` pointer readers follow.

``python -m beam_pipelines.versions ROOT [--next | --set_latest VERSION]``

Layout::

  ROOT/v0001/   a complete dataset (dataset.json, shards, index files, catalogs)
  ROOT/v0002/   the next one, built with --base ROOT/v0001 (or --base ROOT: the latest)
  ROOT/latest   one line naming the current version ("v0002"), written last

Readers (``tfrecord_io`` sources, ``diff``, ``--base``) given ``ROOT`` or ``ROOT/latest`` read
the version the pointer names. The pointer is replaced in one step (a rename on local disks,
one PUT on a bucket), and only after the version's ``dataset.json`` is checked, so a reader
following it always lands on a published dataset. Old versions stay until you delete them.

With no option, lists the versions and which is latest. ``--next`` prints the next version's
directory (for ``--output``). ``--set_latest VERSION`` points ``latest`` at a published version.
Exit status: 0 on success, 2 when the root or version is unusable (the message says why).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from beam_pipelines.engines.filesystems import read_object, write_object
from cliflags import StrictArgumentParser, command_name
from cliflags.interrupts import run_command
from schemas import MANIFEST_NAME, Manifest
from schemas.lineage import (
    LATEST_NAME,
    format_latest_pointer,
    parse_latest_pointer,
    parse_version_name,
    version_name,
)

__all__ = ["list_versions", "latest_version", "next_version", "set_latest", "main"]


def list_versions(root: str) -> list[str]:
    """The version directories under ``root`` that hold a ``dataset.json``, oldest first."""
    pattern = FileSystems.join(root, "v*", MANIFEST_NAME)
    found = []
    for meta in FileSystems.match([pattern])[0].metadata_list:
        directory = FileSystems.split(FileSystems.split(meta.path)[0])[1]
        if parse_version_name(directory) is not None:
            found.append(directory)
    return sorted(set(found), key=lambda name: parse_version_name(name) or 0)


def latest_version(root: str) -> str | None:
    """The version ``root/latest`` names, or None when there is no pointer.

    Raises:
      ValueError: if the pointer is malformed.
    """
    pointer = FileSystems.join(root, LATEST_NAME)
    if not FileSystems.exists(pointer):
        return None
    return parse_latest_pointer(read_object(pointer), name=pointer)


def next_version(root: str) -> str:
    """The directory for the next version: one past the highest ``vNNNN`` under ``root``
    (published or not, so a failed build's directory is never reused by accident)."""
    numbers = [0]
    for meta in FileSystems.match([FileSystems.join(root, "v*", "*")])[0].metadata_list:
        directory = FileSystems.split(FileSystems.split(meta.path)[0])[1]
        number = parse_version_name(directory)
        if number is not None:
            numbers.append(number)
    return FileSystems.join(root, version_name(max(numbers) + 1))


def set_latest(root: str, version: str) -> str:
    """Points ``root/latest`` at ``version`` after checking that it is published.

    Returns:
      The pointer's path.

    Raises:
      ValueError: if ``version`` is not a directory name, has no valid ``dataset.json``, or is
        still being written (``.staging`` present), naming it.
    """
    text = format_latest_pointer(version)
    directory = FileSystems.join(root, version)
    manifest = FileSystems.join(directory, MANIFEST_NAME)
    if not FileSystems.exists(manifest):
        raise ValueError(
            f"{manifest} does not exist: {version} is not a published dataset; build it first"
        )
    try:
        Manifest.from_json(read_object(manifest))
    except ValueError as e:
        raise ValueError(f"{manifest}: {e}") from e
    staging = FileSystems.match([FileSystems.join(directory, ".staging", "*")], limits=[1])
    if staging[0].metadata_list:
        raise ValueError(f"{directory}/.staging exists: a build is still writing {version}")
    pointer = FileSystems.join(root, LATEST_NAME)
    write_object(pointer, text.encode("ascii"))
    return pointer


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status: 130 or 143 after Ctrl-C or SIGTERM (one line,
    no traceback), 141 when the reader of its output went away (``| head``)."""
    return run_command(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = StrictArgumentParser(
        prog=command_name("beam_pipelines.versions"),
        description="List dataset versions under ROOT, or move ROOT/latest.",
    )
    parser.add_argument("root", help="directory or URI holding v0001/, v0002/... and latest")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--next", action="store_true", help="print the next version's directory")
    group.add_argument("--set_latest", metavar="VERSION", help="point latest at VERSION")
    args = parser.parse_args(argv)
    root = args.root.rstrip("/")
    try:
        if args.next:
            print(next_version(root))
        elif args.set_latest:
            pointer = set_latest(root, args.set_latest)
            print(f"{pointer} -> {args.set_latest}")
        else:
            latest = latest_version(root)
            for name in list_versions(root):
                print(f"{name}{'  (latest)' if name == latest else ''}")
            if latest is None:
                print(f"no {LATEST_NAME} pointer under {root}")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
