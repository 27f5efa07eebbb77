"""An ``argparse`` parser that refuses unknown flags with a "did you mean" line.

``argparse`` in Python 3.11 accepts unique prefixes of flags (``--step`` for ``--steps``) and,
when a required flag is also missing, reports that first, so a misspelled ``--stpes 5`` reads as
"one of the arguments --steps --epochs is required". ``StrictArgumentParser`` checks every flag
before anything else: an unknown one ends the program with status 2, its name and the closest
known flag (``--num-shards`` -> ``--num_shards``, ``--encodng`` -> ``--encoding``), the
command's own flags before those it hands on (``--stratify`` -> ``--stratify_validation``, not
Beam's ``--streaming``).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import types
from collections.abc import Iterable, Sequence

__all__ = [
    "StrictArgumentParser",
    "command_name",
    "quiet_tensorflow",
    "suggest_flag",
    "unknown_flags",
]

_QUIET_LEVEL = "2"  # TensorFlow logs errors only
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _normalised(flag: str) -> str:
    return "--" + flag.lstrip("-").replace("-", "_").lower()


def _by_normal(flags: Iterable[str]) -> dict[str, str]:
    by_normal: dict[str, str] = {}
    for name in flags:
        if name.startswith("--"):
            by_normal.setdefault(_normalised(name), name)
    return by_normal


def suggest_flag(flag: str, known: Iterable[str], *, first: Iterable[str] = ()) -> str | None:
    """The known flag closest to ``flag`` (dashes and underscores, case ignored), or None.

    Args:
      flag: the unknown flag, maybe with ``=value``.
      known: every flag the command accepts.
      first: flags to prefer at each step (the command's own, before those it hands on): the
        same spelling, then the one flag the typed one starts, then a close spelling.
    """
    preferred = _by_normal(first)
    tables = [preferred, {**_by_normal(known), **preferred}]
    wanted = _normalised(flag.split("=", 1)[0])
    for table in tables:
        if wanted in table:
            return table[wanted]
    # An abbreviation (refused: a typo must not select another flag) names the one flag it
    # starts, when it starts only one.
    for table in tables:
        started = [normal for normal in table if normal.startswith(wanted)]
        if len(started) == 1:
            return table[started[0]]
    # A close spelling among the preferred flags must be closer than one among all.
    for table, cutoff in zip(tables, (0.75, 0.6), strict=True):
        close = difflib.get_close_matches(wanted, list(table), n=1, cutoff=cutoff)
        if close:
            return table[close[0]]
    return None


def unknown_flags(argv: Sequence[str], known: Iterable[str]) -> list[str]:
    """Every token of ``argv`` that looks like a flag and is not one of ``known``.

    ``--flag=value`` is checked by its name; negative numbers and everything after ``--`` are
    values, never flags.
    """
    known = set(known)
    unknown: list[str] = []
    for token in argv:
        if token == "--":
            break
        if not token.startswith("-") or token == "-" or _NUMBER.match(token):
            continue
        name = token.split("=", 1)[0] if token.startswith("--") else token
        if name not in known:
            unknown.append(name)
    return unknown


class StrictArgumentParser(argparse.ArgumentParser):
    """``ArgumentParser`` that rejects unknown flags first, naming the closest known flag.

    Abbreviated flags are not accepted (``allow_abbrev=False``): a typo must never select some
    other flag. ``extra_known_flags`` lets a command pass flags it hands on to another parser
    (Beam's pipeline options) through ``parse_known_args``.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.extra_known_flags: set[str] = set()

    def known_flags(self) -> set[str]:
        """Every flag this parser, its subcommands or the parser it hands over to accept.

        A subcommand's parser checks its own flags again when it runs.
        """
        known = set(self._option_string_actions) | self.extra_known_flags
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    known |= (
                        sub.known_flags()
                        if isinstance(sub, StrictArgumentParser)
                        else set(sub._option_string_actions)
                    )
        return known

    def check_flags(self, argv: Sequence[str]) -> None:
        """Exits with status 2 on the first unknown flag, with a "did you mean" line."""
        known = self.known_flags()
        own = known - self.extra_known_flags
        for flag in unknown_flags(argv, known):
            # The command's own flags first: a near miss of ours (--stratify) is far likelier
            # than one of the many flags handed on (Beam's --streaming).
            suggestion = suggest_flag(flag, known, first=own)
            hint = f"\ndid you mean {suggestion}?" if suggestion else f"\nsee {self.prog} --help"
            self.error(f"unrecognized flag {flag}{hint}")

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        self.check_flags(argv)
        return super().parse_known_args(argv, namespace)

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(f"unexpected argument {' '.join(extra)}")
        return parsed


def command_name(module: str) -> str:
    """How the user started the command: its console script's name, or ``python -m module``."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not invoked or invoked.endswith(".py") or invoked in ("-c", "-m", "python", "pytest"):
        return f"python -m {module}"
    return invoked


class _QuietImportLoader(importlib.abc.Loader):
    """Runs TensorFlow's import with standard error (the file descriptor) pointed at
    /dev/null: its C++ libraries log their start-up lines (oneDNN, "All log messages before
    absl::InitializeLog()") while they load, before any log level applies."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        sys.stderr.flush()
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            self._loader.exec_module(module)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` as the other finders do, and loads it quietly (once)."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # one import of TensorFlow per process
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietImportLoader(spec.loader)
        return spec


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    """Adds ``--verbose``, which shows what ``quiet_tensorflow`` hides (a tool calls
    ``quiet_tensorflow(verbose=args.verbose)`` right after parsing)."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's start-up lines and info logs (hidden unless TF_CPP_MIN_LOG_LEVEL "
        "is set)",
    )


def quiet_tensorflow(*, verbose: bool = False) -> None:
    """Keeps TensorFlow's C++ start-up lines and info and warning logs out of the output,
    unless the user asked for them (``verbose``, or their own ``TF_CPP_MIN_LOG_LEVEL``).

    Sets ``TF_CPP_MIN_LOG_LEVEL=2`` and loads TensorFlow, when something first imports it,
    with standard error silenced: the lines its libraries print while loading ignore any
    level. A failed import still raises. ``verbose`` undoes what an earlier call did (an
    import of ``tfrecord_io`` makes one). Does nothing once TensorFlow is imported.

    Must run before TensorFlow is first imported (every entry point calls it first in ``main``;
    ``tfrecord_io`` when it is imported).
    """
    if "tensorflow" in sys.modules:
        return
    finders = [f for f in sys.meta_path if isinstance(f, _QuietTensorFlowFinder)]
    if verbose:
        for finder in finders:
            sys.meta_path.remove(finder)
        if finders and os.environ.get("TF_CPP_MIN_LOG_LEVEL") == _QUIET_LEVEL:
            del os.environ["TF_CPP_MIN_LOG_LEVEL"]  # ours, not the user's
        return
    if finders or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return  # done already, or the user chose a level: theirs holds
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = _QUIET_LEVEL
    sys.meta_path.insert(0, _QuietTensorFlowFinder())
