"""How a dataset tool's command starts and ends, the same for ``verify``, ``inspect``, ``diff``
and ``adopt``: a strict parser named as the user started it, ``--verbose``, TensorFlow's
start-up lines kept out of the report, and the exit status after a signal or a closed pipe.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from cliflags import StrictArgumentParser, add_verbose_flag, command_name, quiet_tensorflow
from cliflags.interrupts import run_command, signal_name

__all__ = ["parse_tool_args", "run_tool", "tool_parser"]


def run_tool(body: Callable[[], int], *, unfinished: str | None = None) -> int:
    """Runs a tool's ``body`` and returns its exit status: ``body``'s own, 130 or 143 after
    Ctrl-C or SIGTERM (one line, no traceback), 141 when the reader of its output went away
    (``| head``).

    ``unfinished`` says what an interruption leaves undone (``"dataset.json was not
    written"``); the line is then ``interrupted by SIGINT; <unfinished>: run the command
    again``. Without it, ``cliflags.interrupts.run_command``'s line.
    """
    if unfinished is None:
        return run_command(body)
    return run_command(
        body,
        on_interrupt=lambda signum: (
            f"interrupted by {signal_name(signum)}; {unfinished}: run the command again"
        ),
    )


def tool_parser(module: str, description: str) -> StrictArgumentParser:
    """The parser of the tool run as ``python -m <module>``, named as the user started it."""
    return StrictArgumentParser(prog=command_name(module), description=description)


def parse_tool_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """Adds ``--verbose`` to ``parser``, parses ``argv`` and keeps TensorFlow's start-up lines
    out of the report (they would bury it), unless ``--verbose`` or the user's own
    ``TF_CPP_MIN_LOG_LEVEL`` asks for them."""
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_tensorflow(verbose=args.verbose)
    return args
