"""An ``argparse`` parser that refuses unknown flags with a "did you mean" line.

``argparse`` in Python 3.11 accepts unique prefixes of flags (``--step`` for ``--steps``) and,
when a required flag is also missing, reports that first, so a misspelled ``--stpes 5`` reads as
"one of the arguments --steps --epochs is required". ``StrictArgumentParser`` checks every flag
before anything else: an unknown one ends the program with status 2, its name and the closest
known flag (``--num-shards`` -> ``--num_shards``, ``--encodng`` -> ``--encoding``), the
command's own flags before those it hands on (``--stratify`` -> ``--stratify_validation``, not
Beam's ``--streaming``). A command with subcommands checks the flags before the subcommand as its
own and hands the rest to the subcommand's parser, so suggestions come from the chosen
subcommand's flags (``dispatcher --dispatcher_prot`` -> ``--port``), and a flag of another
subcommand, or one given before the subcommand, is named as such. ``flag_hints`` answers flags a
user is likely to bring from another command (the trainer's ``--resume``) with what to do instead.
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
from collections.abc import Iterable, Mapping, Sequence

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
    # A close spelling among the preferred flags must be closer than one among all; a flag
    # qualified with a leading word (--dispatcher_prot for a dispatcher's --port) is tried
    # without it before the looser match among all.
    close = difflib.get_close_matches(wanted, list(preferred), n=1, cutoff=0.75)
    if close:
        return preferred[close[0]]
    words = wanted[2:].split("_")
    for dropped in range(1, len(words)):
        unqualified = "--" + "_".join(words[dropped:])
        close = difflib.get_close_matches(unqualified, list(preferred), n=1, cutoff=0.75)
        if close:
            return preferred[close[0]]
    close = difflib.get_close_matches(wanted, list(tables[1]), n=1, cutoff=0.6)
    return tables[1][close[0]] if close else None


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
    (Beam's pipeline options) through ``parse_known_args``. ``flag_hints`` maps a flag the
    command does not take to the line that replaces "did you mean" (what to do instead).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.extra_known_flags: set[str] = set()
        self.flag_hints: dict[str, str] = {}

    def subcommands(self) -> dict[str, argparse.ArgumentParser]:
        """Subcommand name -> its parser (empty for a command without subcommands)."""
        found: dict[str, argparse.ArgumentParser] = {}
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                found.update(action.choices)
        return found

    def known_flags(self) -> set[str]:
        """The flags this parser takes itself or hands over (not its subcommands')."""
        return set(self._option_string_actions) | self.extra_known_flags

    def _subcommand_at(self, argv: Sequence[str], names: Iterable[str]) -> int | None:
        """The index of the subcommand in ``argv`` (the first token naming one that is not a
        flag's value), or None."""
        names = set(names)
        takes_value = {
            name for name, action in self._option_string_actions.items() if action.nargs != 0
        }
        value_next = False
        for index, token in enumerate(argv):
            if token == "--":
                return None
            if value_next:
                value_next = False
            elif token.startswith("-") and token != "-" and not _NUMBER.match(token):
                value_next = "=" not in token and token in takes_value
            elif token in names:
                return index
        return None

    def check_flags(
        self, argv: Sequence[str], *, siblings: Mapping[str, set[str]] | None = None
    ) -> None:
        """Exits with status 2 on the first unknown flag, with a "did you mean" line.

        Flags after a subcommand are checked by its parser, against its own flags first.

        Args:
          argv: the command line after the program (or subcommand) name.
          siblings: for a subcommand's parser, the other subcommands' names -> their flags,
            so a flag of another one is named as such.
        """
        argv = list(argv)
        subcommands = self.subcommands()
        at = self._subcommand_at(argv, subcommands)
        if at is not None:
            chosen = subcommands[argv[at]]
            if isinstance(chosen, StrictArgumentParser):
                others = {
                    name: set(sub._option_string_actions)
                    for name, sub in subcommands.items()
                    if name != argv[at]
                }
                chosen.check_flags(argv[at + 1 :], siblings=others)
            argv = argv[:at]
        known = self.known_flags()
        for flag in unknown_flags(argv, known):
            self.error(f"unrecognized flag {flag}\n{self._hint(flag, known, siblings or {})}")

    def _hint(self, flag: str, known: set[str], siblings: Mapping[str, set[str]]) -> str:
        """The line after "unrecognized flag": what to do instead, the closest flag, or --help."""
        wanted = _normalised(flag.split("=", 1)[0])
        hints = {_normalised(name): hint for name, hint in self.flag_hints.items()}
        if wanted in hints:
            return hints[wanted]
        # The command's own flags first: a near miss of ours (--stratify) is far likelier
        # than one of the many flags handed on (Beam's --streaming).
        own = known - self.extra_known_flags
        suggestion = suggest_flag(flag, known, first=own)
        if suggestion is not None and _normalised(suggestion) == wanted:
            return f"did you mean {suggestion}?"  # the same flag, spelt with dashes or capitals
        for name, flags in siblings.items():
            if wanted in _by_normal(flags):
                return f"{_by_normal(flags)[wanted]} is a flag of {name}; see {self.prog} --help"
        if suggestion is not None:
            return f"did you mean {suggestion}?"
        elsewhere = {
            name: set(sub._option_string_actions) for name, sub in self.subcommands().items()
        }
        if elsewhere:
            return self._subcommand_hint(flag, elsewhere) or f"see {self.prog} --help"
        return f"see {self.prog} --help"

    def _subcommand_hint(self, flag: str, subcommands: Mapping[str, set[str]]) -> str | None:
        """For a flag given before the subcommand: the subcommand and flag it likely meant,
        ``--dispatcher_port`` naming ``dispatcher --port``."""
        wanted = _normalised(flag.split("=", 1)[0])
        for name, flags in subcommands.items():
            qualifier = _normalised(name) + "_"
            if wanted.startswith(qualifier) and len(wanted) > len(qualifier):
                suggestion = suggest_flag("--" + wanted[len(qualifier) :], flags)
                if suggestion is not None:
                    return f"did you mean {self.prog} {name} {suggestion}?"
        suggestion = suggest_flag(flag, set().union(*subcommands.values()))
        if suggestion is None:
            return None
        names = [name for name, flags in subcommands.items() if suggestion in flags]
        where = names[0] if len(names) == 1 else "{" + ",".join(names) + "}"
        return f"did you mean {self.prog} {where} {suggestion}? (a subcommand's flags follow it)"

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
