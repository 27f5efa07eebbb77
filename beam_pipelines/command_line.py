"""The pipeline's command line: our flags (grouped for ``--help``), strict, Beam's passed on.

Our flags are parsed first; whatever is left must be a Beam pipeline option (``--runner``,
``--direct_num_workers``, ``--temp_location``...), checked against every option Beam knows.
Anything neither knows ends the command with status 2 and the closest flag, before any work.
Our flags are declared once, on ``PipelineConfig``'s fields (``cliflags.flag``): Beam's
``ImagesToTFRecordOptions`` and this parser both generate them from there
(``cliflags.add_dataclass_flags``), the parser in the ``--help`` group each field names
(``OPTION_GROUPS``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.config import HELP_GROUPS, ImagesToTFRecordOptions, PipelineConfig
from cliflags import StrictArgumentParser, add_dataclass_flags, command_name, flag_groups

__all__ = [
    "OPTION_GROUPS",
    "COMMAND_FLAGS",
    "beam_option_parser",
    "build_parser",
    "parse_command_line",
]

# Where each pipeline flag is listed in --help, in this order: made from the fields' groups.
OPTION_GROUPS: dict[str, tuple[str, ...]] = flag_groups(PipelineConfig, HELP_GROUPS)
# Flags of the command itself, listed under "output" and never handed to Beam: flag ->
# add_argument keywords.
_COMMAND_FLAG_OPTIONS: dict[str, dict[str, Any]] = {
    "--json": {"action": "store_true", "help": "print the run's summary as JSON (for machines)"},
    "--progress": {
        "choices": ("auto", "bar", "log", "off"),
        "default": "auto",
        "help": "progress while images are prepared: a bar on a terminal, log lines otherwise "
        "(%(default)s)",
    },
    "--help_beam": {"action": "store_true", "help": "list Beam's pipeline options and exit"},
}
COMMAND_FLAGS = tuple(_COMMAND_FLAG_OPTIONS)
_BEAM_DOCS = (
    "https://beam.apache.org/releases/pydoc/current/apache_beam.options.pipeline_options.html"
)
_EPILOG = (
    "Beam pipeline options (--runner, --direct_num_workers, --direct_running_mode, "
    "--temp_location, --project, --region, --s3_endpoint_url, --dask_client_address...) pass "
    f"through to Beam: list them with --help_beam, or see {_BEAM_DOCS}"
)


def beam_option_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser Beam builds of every pipeline option (``PipelineOptions.get_all_options``),
    ours hidden from its help.

    Option classes register themselves when their module is imported: the Spark storage
    level's always (a misspelling of it then gets its suggestion), the Dask runner's when
    ``argv`` uses them (Dask's import is heavy).
    """
    import beam_pipelines.engines.spark  # noqa: F401  (registers SparkStorageOptions)

    if any(arg.startswith("--dask_") for arg in argv):
        import apache_beam.runners.dask.dask_runner  # noqa: F401  (registers DaskOptions)
    built: list[argparse.ArgumentParser] = []
    # PipelineOptions() calls logging.basicConfig(): the command sets up logging itself, later,
    # and a handler left here would give its log lines Python's default format instead.
    handlers = list(logging.root.handlers)
    try:
        # Beam hands its parser, every options class registered, to this callback.
        PipelineOptions(flags=[]).get_all_options(add_extra_args_fn=built.append)
        ours = ImagesToTFRecordOptions(flags=[]).get_all_options(current_only=True)
    finally:
        logging.root.handlers[:] = handlers
    parser = built[0]
    parser.prog = "Beam pipeline options"
    for flag, action in parser._option_string_actions.items():
        if flag.lstrip("-") in ours or action.dest in ours:
            action.help = argparse.SUPPRESS  # listed by --help, in their groups
    return parser


def build_parser(prog: str | None = None, argv: Sequence[str] = ()) -> StrictArgumentParser:
    """The command's parser: our flags in their groups, Beam's accepted as pass-through."""
    parser = StrictArgumentParser(
        prog=prog or command_name("beam_pipelines.images_to_tfrecord"),
        usage="%(prog)s --input SRC --output DST [options] [Beam pipeline options]",
        description="Images -> deterministic TFRecord shards + dataset.json, with Apache Beam.",
        epilog=_EPILOG,
    )
    groups = {title: parser.add_argument_group(title) for title in HELP_GROUPS}
    # Not required here either: --help_beam needs no --input (config_from_options checks).
    add_dataclass_flags(parser, PipelineConfig, groups=groups, enforce_required=False)
    for flag, options in _COMMAND_FLAG_OPTIONS.items():
        groups["output"].add_argument(flag, **options)
    parser.extra_known_flags = set(beam_option_parser(argv)._option_string_actions)
    return parser


def _without_command_flags(argv: Sequence[str]) -> list[str]:
    """``argv`` without the command's own flags (and their values), for ``PipelineOptions``."""
    kept: list[str] = []
    skip_value = False
    for arg in argv:
        flag, equals, _ = arg.partition("=")
        if skip_value:
            skip_value = False
        elif flag in _COMMAND_FLAG_OPTIONS:
            # A flag that takes a value, written as two arguments: the next one is its value.
            takes_value = _COMMAND_FLAG_OPTIONS[flag].get("action") != "store_true"
            skip_value = takes_value and not equals
        else:
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
