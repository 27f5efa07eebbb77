"""The pipeline's command line: our flags (grouped for ``--help``), strict, Beam's passed on.

Our flags are parsed first; whatever is left must be a Beam pipeline option (``--runner``,
``--direct_num_workers``, ``--temp_location``...), checked against every option Beam knows.
Anything neither knows ends the command with status 2 and the closest flag, before any work.
The flags themselves stay defined on ``config.ImagesToTFRecordOptions``, Beam's way, so that
``PipelineOptions`` parses them from the same argv; ``OPTION_GROUPS`` only says where each one
is listed in ``--help``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from beam_pipelines.config import ImagesToTFRecordOptions
from cliflags import StrictArgumentParser, command_name

__all__ = [
    "OPTION_GROUPS",
    "COMMAND_FLAGS",
    "beam_option_parser",
    "build_parser",
    "parse_command_line",
]

# Where each of ImagesToTFRecordOptions' flags is listed in --help, in this order. A flag not
# named here is listed under "other options" (a test keeps that group empty).
OPTION_GROUPS: dict[str, tuple[str, ...]] = {
    "input": ("--input",),
    "image": (
        "--image_size",
        "--crop",
        "--encoding",
        "--jpeg_quality",
        "--background",
        "--max_pixels",
        "--max_aspect_ratio",
        "--max_output_pixels",
        "--out_of_bounds",
        "--accepted_formats",
        "--high_bit_depth",
    ),
    "sharding": (
        "--validation_fraction",
        "--stratify_validation",
        "--num_shards",
        "--target_shard_mb",
    ),
    "quality gates": (
        "--max_bad_fraction",
        "--label_conflicts",
        "--leakage",
        "--near_duplicate_threshold",
    ),
    "output": ("--output", "--overwrite", "--resume", "--base", "--staging_file_mb"),
}
# Flags of the command itself, never handed to Beam.
COMMAND_FLAGS = ("--json", "--progress", "--help_beam")
_OTHER = "other options"
_BEAM_DOCS = (
    "https://beam.apache.org/releases/pydoc/current/apache_beam.options.pipeline_options.html"
)
_EPILOG = (
    "Beam pipeline options (--runner, --direct_num_workers, --direct_running_mode, "
    "--temp_location, --project, --region, --s3_endpoint_url, --dask_client_address...) pass "
    f"through to Beam: list them with --help_beam, or see {_BEAM_DOCS}"
)


class _GroupRouter:
    """Stands in for a parser in ``_add_argparse_args``: each flag goes to its help group."""

    def __init__(self, groups: dict[str, argparse._ArgumentGroup]) -> None:
        self._groups = groups
        self._where = {flag: title for title, flags in OPTION_GROUPS.items() for flag in flags}

    def add_argument(self, *names: str, **kwargs):
        title = self._where.get(names[0], _OTHER)
        return self._groups[title].add_argument(*names, **kwargs)


def beam_option_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """A parser of every Beam pipeline option (ours left out), as Beam builds it.

    Option classes register themselves when their module is imported; the Dask runner's are
    imported here when ``argv`` uses them.
    """
    if any(arg.startswith("--dask_") for arg in argv):
        import apache_beam.runners.dask.dask_runner  # noqa: F401  (registers DaskOptions)
    parser = _BeamArgumentParser(prog="Beam pipeline options", allow_abbrev=False, add_help=False)
    classes = {str(cls): cls for cls in PipelineOptions.__subclasses__()}
    for cls in classes.values():
        if cls is not ImagesToTFRecordOptions:
            cls._add_argparse_args(parser)  # Beam's own registration hook
    return parser


def build_parser(prog: str | None = None, argv: Sequence[str] = ()) -> StrictArgumentParser:
    """The command's parser: our flags in their groups, Beam's accepted as pass-through."""
    parser = StrictArgumentParser(
        prog=prog or command_name("beam_pipelines.images_to_tfrecord"),
        usage="%(prog)s --input SRC --output DST [options] [Beam pipeline options]",
        description="Images -> deterministic TFRecord shards + dataset.json, with Apache Beam.",
        epilog=_EPILOG,
    )
    groups = {title: parser.add_argument_group(title) for title in (*OPTION_GROUPS, _OTHER)}
    ImagesToTFRecordOptions._add_argparse_args(_GroupRouter(groups))
    output = groups["output"]
    output.add_argument(
        "--json", action="store_true", help="print the run's summary as JSON (for machines)"
    )
    output.add_argument(
        "--progress",
        choices=("auto", "bar", "log", "off"),
        default="auto",
        help="progress while images are prepared: a bar on a terminal, log lines otherwise (auto)",
    )
    output.add_argument(
        "--help_beam", action="store_true", help="list Beam's pipeline options and exit"
    )
    parser.extra_known_flags = set(beam_option_parser(argv)._option_string_actions)
    return parser


def _without_command_flags(argv: Sequence[str]) -> list[str]:
    kept: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
        elif arg in ("--json", "--help_beam"):
            pass
        elif arg == "--progress":
            skip_value = True
        elif not arg.startswith("--progress="):
            kept.append(arg)
    return kept


def parse_command_line(
    argv: Sequence[str], prog: str | None = None
) -> tuple[argparse.Namespace, list[str]]:
    """Checks the whole command line; returns our flags and the argv for ``PipelineOptions``.

    Exits with status 2 (``SystemExit``) on a flag neither we nor Beam know, naming the closest
    known flag, and with status 0 after ``--help`` or ``--help_beam``.
    """
    argv = list(argv)
    parser = build_parser(prog, argv)
    args, rest = parser.parse_known_args(argv)
    beam = beam_option_parser(argv)
    _, unknown = beam.parse_known_args(rest)
    if unknown:
        parser.error(f"unexpected argument {' '.join(unknown)}")
    if args.help_beam:
        beam.print_help(sys.stdout)
        parser.exit(0)
    return args, _without_command_flags(argv)
