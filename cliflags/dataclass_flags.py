"""Command-line flags generated from a config dataclass, so that each flag is written once.

Every field of the dataclass becomes ``--<field>``: its type from the annotation, its one
default from the field's default, its help from the field's ``flag(...)`` metadata (or, for a
dataclass without it, from the ``Attributes:`` section of its docstring), and the help line
ends with the default. Values are checked once, by the dataclass's ``__post_init__``, not by
argparse; ``flag_values`` hands the parsed flags back as the dataclass's keyword arguments.

Fields whose type is itself a dataclass (nested configs) and fields marked ``NO_FLAG`` get no
flag. A ``bool`` that defaults to False is a switch (``--x``); any other ``bool`` (True, or
None for "decided later") gets ``--x`` and ``--no-x``.

Example::

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class RunConfig:
        steps: int = dataclasses.field(default=10, metadata=flag("steps to train"))

    add_dataclass_flags(parser, RunConfig)
    config = RunConfig(**flag_values(RunConfig, parser.parse_args()))
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "NO_FLAG",
    "Flag",
    "FlagContainer",
    "add_dataclass_flags",
    "field_docs",
    "flag",
    "flag_values",
]

_KEY = "cliflags.flag"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flag:
    """How one dataclass field appears on the command line.

    Attributes:
      help: the help line, without the default (added from the field).
      name: the flag's name without dashes, when it is not the field's.
      choices: the values the flag accepts, listed in its usage.
      default_text: what the help says the default is, instead of the field's value (for
        example what None means).
      derived: the flag defaults to unset, and the entry point derives the value from this
        (for example a manifest); the field's own default is the fallback when it cannot.
        ``flag_values`` leaves an unset derived field out.
      one_of: fields sharing this name form a required group: exactly one of their flags
        must be given.
    """

    help: str
    name: str | None = None
    choices: Sequence[str] | None = None
    default_text: str | None = None
    derived: str | None = None
    one_of: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.help, str) or not self.help:
            raise ValueError(f"a flag needs a help line, got {self.help!r}")
        if self.derived is not None and self.default_text is not None:
            raise ValueError(
                f"give derived or default_text, not both: {self.derived!r}, {self.default_text!r}"
            )


def flag(
    help: str,
    *,
    name: str | None = None,
    choices: Sequence[str] | None = None,
    default_text: str | None = None,
    derived: str | None = None,
    one_of: str | None = None,
) -> Mapping[str, Flag]:
    """Field metadata giving a field's flag (``dataclasses.field(metadata=flag(...))``).

    Args: as the attributes of ``Flag``.

    Raises:
      ValueError: if ``help`` is empty, or both ``derived`` and ``default_text`` are given.
    """
    return {
        _KEY: Flag(
            help=help,
            name=name,
            choices=choices,
            default_text=default_text,
            derived=derived,
            one_of=one_of,
        )
    }


class FlagContainer(Protocol):
    """What flags are added to: an ``argparse.ArgumentParser`` or one of its groups."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...

    def add_mutually_exclusive_group(self, *, required: bool = False) -> Any: ...


# Field metadata for a field that has no flag (it keeps its default on the command line).
NO_FLAG: Mapping[str, None] = {_KEY: None}


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its description in ``cls``'s ``Attributes:`` docstring section."""
    docs: dict[str, list[str]] = {}
    current = None
    section = (cls.__doc__ or "").partition("Attributes:")[2].partition("Raises:")[0]
    for line in section.splitlines():
        match = re.match(r"^      (\w+): (.*)$", line)
        if match:
            current = match.group(1)
            docs[current] = [match.group(2)]
        elif current is not None and line.strip():
            docs[current].append(line.strip())
    return {name: " ".join(words) for name, words in docs.items()}


def _flagged_fields(cls: type) -> list[tuple[dataclasses.Field[Any], Flag | None, Any]]:
    """``(field, its Flag or None, its type)`` of every field of ``cls`` that has a flag."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"expected a dataclass, got {cls!r}")
    hints = typing.get_type_hints(cls)
    fields = []
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if field.metadata.get(_KEY, ...) is None or dataclasses.is_dataclass(kind):
            continue
        fields.append((field, field.metadata.get(_KEY), kind))
    return fields


def _flag_name(field: dataclasses.Field[Any], spec: Flag | None) -> str:
    return spec.name if spec is not None and spec.name else field.name


def _help(text: str, default: str | None) -> str:
    # argparse expands %-formats in help: a literal % must be doubled.
    text = text.replace("``", "").replace("%", "%%")
    return text if default is None else f"{text} (default: {default.replace('%', '%%')})"


def add_dataclass_flags(parser: FlagContainer, cls: type) -> None:
    """Adds one flag per field of the dataclass ``cls`` to ``parser`` (or an argument group).

    Args:
      parser: an ``ArgumentParser`` or one of its argument groups.
      cls: the config dataclass.

    Raises:
      TypeError: if ``cls`` is not a dataclass.
      ValueError: if a field's type is a union of more than one type besides None.
    """
    groups: dict[str, FlagContainer] = {}
    docs = field_docs(cls)
    for field, spec, kind in _flagged_fields(cls):
        options: dict[str, Any] = {}
        required = field.default is dataclasses.MISSING and field.default_factory is (
            dataclasses.MISSING
        )
        default = None if required else field.default
        container = parser
        if spec is not None and spec.one_of:
            if spec.one_of not in groups:
                groups[spec.one_of] = parser.add_mutually_exclusive_group(required=True)
            container, required, shown = groups[spec.one_of], False, None
        elif required:
            shown = None
        elif spec is not None and spec.derived:
            default, shown = None, f"{spec.derived}; else {field.default}"
        elif spec is not None and spec.default_text:
            shown = spec.default_text
        else:
            shown = str(default)
        types = [t for t in typing.get_args(kind) or (kind,) if t is not type(None)]
        if len(types) != 1:
            raise ValueError(
                f"field {field.name!r} of {cls.__name__} has type {kind}: one expected"
            )
        if types[0] is bool:
            options["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
        elif types[0] is not str:  # argparse's values are strings already
            options["type"] = types[0]
        if spec is not None and spec.choices is not None:
            options["choices"] = spec.choices
        if required:
            options["required"] = True
        else:
            options["default"] = default
        text = spec.help if spec is not None else docs.get(field.name, "")
        container.add_argument(f"--{_flag_name(field, spec)}", help=_help(text, shown), **options)


def flag_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments for ``cls`` from flags that ``add_dataclass_flags`` added.

    A derived flag left unset is left out, so the entry point can fill it in or let the
    dataclass's default apply.

    Raises:
      TypeError: if ``cls`` is not a dataclass.
    """
    values = {}
    for field, spec, _ in _flagged_fields(cls):
        value = getattr(args, _flag_name(field, spec))
        if value is None and spec is not None and spec.derived:
            continue
        values[field.name] = value
    return values
