"""Command-line flags generated from a config dataclass, so that each flag is written once.

Every field of the dataclass becomes ``--<field>``: its type from the annotation, its one
default from the field's default, its help from the field's ``flag(...)`` metadata (or, for a
dataclass without it, from the ``Attributes:`` section of its docstring), and the help line
ends with the default unless the help places it (``%(default)s``) or says it needs none.
Values are checked once, by the dataclass's ``__post_init__``, not by argparse;
``flag_values`` hands the parsed flags back as the dataclass's keyword arguments.

Fields marked ``NO_FLAG`` get no flag. A field whose type is itself a dataclass (a nested
config) gets none either, unless it is marked ``NESTED_FLAGS``: then its dataclass's flags
are added in its place and ``flag_values`` builds it. A ``bool`` that defaults to False is a
switch (``--x``); any other ``bool`` (True, or None for "decided later") gets ``--x`` and
``--no-x``. A flag with ``parse`` takes text, which ``parse`` turns into the field's value.

A flag may name a ``--help`` group: ``add_dataclass_flags(..., groups=...)`` lists it there,
and ``flag_groups`` says which flags each group holds.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "NESTED_FLAGS",
    "NO_FLAG",
    "Flag",
    "FlagContainer",
    "add_dataclass_flags",
    "field_docs",
    "flag",
    "flag_groups",
    "flag_values",
]

_KEY = "cliflags.flag"
_Group = typing.TypeVar("_Group")
_NESTED_KEY = "cliflags.nested"
_DEFAULT_PLACEHOLDER = "%(default)s"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flag:
    """How one dataclass field appears on the command line.

    Attributes:
      help: the help line, without the default (added from the field), or with
        ``%(default)s`` where the default is to be shown.
      name: the flag's name without dashes, when it is not the field's.
      choices: the values the flag accepts, listed in its usage.
      default_text: what the help says the default is, instead of the field's value (for
        example what None means).
      derived: the flag defaults to unset, and the entry point derives the value from this
        (for example a manifest); the field's own default is the fallback when it cannot.
        ``flag_values`` leaves an unset derived field out.
      one_of: fields sharing this name form a required group: exactly one of their flags
        must be given.
      group: the ``--help`` group the flag is listed in (``add_dataclass_flags``'s
        ``groups``).
      parse: turns the flag's text into the field's value (for example ``#ffffff`` into an
        RGB tuple); None when argparse gives the field's type itself.
      text_default: the flag's default as typed on the command line, for a field with
        ``parse`` (``parse`` makes the field's value from it).
      show_default: False when the help line shows no default: it says it in words, or the
        flag is a switch whose default goes without saying.

    Raises:
      ValueError: for an empty help line, or settings that contradict each other.
    """

    help: str
    name: str | None = None
    choices: Sequence[str] | None = None
    default_text: str | None = None
    derived: str | None = None
    one_of: str | None = None
    group: str | None = None
    parse: Callable[[str], Any] | None = None
    text_default: str | None = None
    show_default: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.help, str) or not self.help:
            raise ValueError(f"a flag needs a help line, got {self.help!r}")
        if self.derived is not None and self.default_text is not None:
            raise ValueError(
                f"give derived or default_text, not both: {self.derived!r}, {self.default_text!r}"
            )
        if self.text_default is not None and self.parse is None:
            raise ValueError(f"text_default {self.text_default!r} needs a parse function")
        if not self.show_default and (self.default_text is not None or self.derived is not None):
            raise ValueError(
                "show_default=False shows no default, so it takes no default_text or derived"
            )


def flag(
    help: str,
    *,
    name: str | None = None,
    choices: Sequence[str] | None = None,
    default_text: str | None = None,
    derived: str | None = None,
    one_of: str | None = None,
    group: str | None = None,
    parse: Callable[[str], Any] | None = None,
    text_default: str | None = None,
    show_default: bool = True,
) -> Mapping[str, Flag]:
    """Field metadata giving a field's flag (``dataclasses.field(metadata=flag(...))``).

    Args: as the attributes of ``Flag``.

    Raises:
      ValueError: if ``help`` is empty, or the settings contradict each other (see ``Flag``).
    """
    return {
        _KEY: Flag(
            help=help,
            name=name,
            choices=choices,
            default_text=default_text,
            derived=derived,
            one_of=one_of,
            group=group,
            parse=parse,
            text_default=text_default,
            show_default=show_default,
        )
    }


class FlagContainer(Protocol):
    """What flags are added to: an ``argparse.ArgumentParser`` or one of its groups."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...

    def add_mutually_exclusive_group(self, *, required: bool = False) -> Any: ...


# Field metadata for a field that has no flag (it keeps its default on the command line).
NO_FLAG: Mapping[str, None] = {_KEY: None}
# Field metadata for a field whose type is a dataclass: its fields' flags stand in its place.
NESTED_FLAGS: Mapping[str, bool] = {_NESTED_KEY: True}


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


@dataclasses.dataclass(frozen=True)
class _FlagField:
    """One field that is a flag: the field, its ``Flag`` (None: help from the docstring), its
    type and the dataclass it belongs to."""

    field: dataclasses.Field[Any]
    spec: Flag | None
    kind: Any
    owner: type

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None and self.spec.name else self.field.name


def _fields(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Any]]:
    """``(field, its type)`` of every field of the dataclass ``cls``.

    Raises:
      TypeError: if ``cls`` is not a dataclass.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"expected a dataclass, got {cls!r}")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        yield field, hints[field.name]


def _nested(field: dataclasses.Field[Any], kind: Any) -> bool:
    """Whether ``field`` contributes its own dataclass's flags (``NESTED_FLAGS``).

    Raises:
      TypeError: if a field marked ``NESTED_FLAGS`` is not of a dataclass type.
    """
    if not field.metadata.get(_NESTED_KEY, False):
        return False
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        raise TypeError(f"field {field.name!r} is marked NESTED_FLAGS but its type {kind} is not")
    return True


def _flag_field(cls: type, field: dataclasses.Field[Any], kind: Any) -> _FlagField | None:
    """``field`` of ``cls`` as a flag, or None if it has none (``NO_FLAG``, or a dataclass)."""
    spec = field.metadata.get(_KEY, ...)
    if spec is None or dataclasses.is_dataclass(kind):
        return None
    return _FlagField(field, spec if isinstance(spec, Flag) else None, kind, cls)


def _flag_fields(cls: type) -> Iterator[_FlagField]:
    """Every field of ``cls`` that has a flag, a nested dataclass's fields in its place."""
    for field, kind in _fields(cls):
        if _nested(field, kind):
            yield from _flag_fields(kind)
        elif (flag_field := _flag_field(cls, field, kind)) is not None:
            yield flag_field


def _group(flag_field: _FlagField, groups: Mapping[str, _Group]) -> _Group:
    """The entry of ``groups`` for the flag's ``--help`` group.

    Raises:
      ValueError: naming the flag, if its group is missing or not one of ``groups``.
    """
    group = flag_field.spec.group if flag_field.spec is not None else None
    if group is None or group not in groups:
        raise ValueError(
            f"--{flag_field.name} is in help group {group!r}, not one of {list(groups)}"
        )
    return groups[group]


def _help(text: str, default: str | None) -> str:
    """The argparse help for ``text``: a literal ``%`` doubled (argparse expands %-formats),
    ``%(default)s`` kept for argparse, and ``default`` (when not None) appended."""
    pieces = text.replace("``", "").split(_DEFAULT_PLACEHOLDER)
    text = _DEFAULT_PLACEHOLDER.join(piece.replace("%", "%%") for piece in pieces)
    return text if default is None else f"{text} (default: {default.replace('%', '%%')})"


def _default(flag_field: _FlagField) -> tuple[Any, bool]:
    """The flag's argparse default, and whether the field has no default (a required flag)."""
    field, spec = flag_field.field, flag_field.spec
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
        return None, True
    if spec is not None and spec.derived:
        return None, False  # unset: the entry point derives the value
    if spec is not None and spec.parse is not None:
        return spec.text_default, False  # the flag takes text; parse makes the value
    if field.default is dataclasses.MISSING:
        return typing.cast(Callable[[], Any], field.default_factory)(), False
    return field.default, False


def _help_line(flag_field: _FlagField, default: Any, required: bool) -> str:
    """The flag's help: its ``Flag.help`` (or the docstring's line) and the default it shows."""
    spec = flag_field.spec
    shown: str | None = str(default)
    if required or (spec is not None and (spec.one_of or not spec.show_default)):
        shown = None
    elif spec is not None and spec.derived:
        shown = f"{spec.derived}; else {flag_field.field.default}"
    elif spec is not None and spec.default_text:
        shown = spec.default_text
    if spec is not None:
        text = spec.help
    else:
        text = field_docs(flag_field.owner).get(flag_field.field.name, "")
    if _DEFAULT_PLACEHOLDER in text:
        shown = None  # the help line shows the default where it says
    return _help(text, shown)


def _argument(flag_field: _FlagField, enforce_required: bool) -> dict[str, Any]:
    """``add_argument`` keywords for one flag, help included (``one_of`` aside).

    Raises:
      ValueError: if the field's type is a union of more than one type besides None.
    """
    spec, kind = flag_field.spec, flag_field.kind
    default, required = _default(flag_field)
    options: dict[str, Any] = {"help": _help_line(flag_field, default, required)}
    types = [t for t in typing.get_args(kind) or (kind,) if t is not type(None)]
    if spec is not None and spec.parse is not None:
        pass  # argparse hands over the text
    elif len(types) != 1:
        raise ValueError(
            f"field {flag_field.field.name!r} of {flag_field.owner.__name__} has type {kind}: "
            "one expected"
        )
    elif types[0] is bool:
        options["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
    elif types[0] is not str:  # argparse's values are strings already
        options["type"] = types[0]
    if spec is not None and spec.choices is not None:
        options["choices"] = spec.choices
    if required and enforce_required:
        options["required"] = True
    else:
        options["default"] = default
    return options


def add_dataclass_flags(
    parser: FlagContainer,
    cls: type,
    *,
    groups: Mapping[str, FlagContainer] | None = None,
    enforce_required: bool = True,
) -> None:
    """Adds one flag per field of the dataclass ``cls`` to ``parser`` (or an argument group).

    Args:
      parser: an ``ArgumentParser`` or one of its argument groups.
      cls: the config dataclass.
      groups: ``--help`` group title -> argument group: each flag goes to its ``Flag.group``
        (``flag_groups`` checks every flag has one). None adds every flag to ``parser``.
      enforce_required: False leaves the flag of a field without a default optional, unset
        as None, for a parser that must accept a command line without it (Beam parses every
        registered options class for every pipeline, and ``--help_beam`` needs no input); the
        entry point then says what is missing.

    Raises:
      TypeError: if ``cls`` is not a dataclass.
      ValueError: if a field's type is a union of more than one type besides None, or a
        flag's group is not one of ``groups``.
    """
    exclusive: dict[str, FlagContainer] = {}
    for flag_field in _flag_fields(cls):
        spec = flag_field.spec
        container = parser if groups is None else _group(flag_field, groups)
        options = _argument(flag_field, enforce_required)
        if spec is not None and spec.one_of:
            if spec.one_of not in exclusive:
                exclusive[spec.one_of] = container.add_mutually_exclusive_group(required=True)
            container = exclusive[spec.one_of]
            options.pop("required", None)
        container.add_argument(f"--{flag_field.name}", **options)


def flag_groups(cls: type, titles: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--help`` group title -> its flags (``--name``), in field order, for each of ``titles``.

    Raises:
      TypeError: if ``cls`` is not a dataclass.
      ValueError: naming a flag whose group is missing or not one of ``titles``.
    """
    groups: dict[str, list[str]] = {title: [] for title in titles}
    for flag_field in _flag_fields(cls):
        _group(flag_field, groups).append(f"--{flag_field.name}")
    return {title: tuple(flags) for title, flags in groups.items()}


def flag_values(cls: type, args: argparse.Namespace | Any) -> dict[str, Any]:
    """The keyword arguments for ``cls`` from flags that ``add_dataclass_flags`` added.

    ``args`` has an attribute per flag (an ``argparse.Namespace``, or Beam's options). A
    flag's text goes through its ``parse`` (a flag left unset, None, stays None); a
    ``NESTED_FLAGS`` field is built from its own dataclass's flags; a derived flag left unset
    is left out, so the entry point can fill it in or let the dataclass's default apply.

    Raises:
      TypeError: if ``cls`` is not a dataclass.
      ValueError: from a ``parse`` function or a nested dataclass's checks, naming the bad
        value.
    """
    values: dict[str, Any] = {}
    for field, kind in _fields(cls):
        if _nested(field, kind):
            values[field.name] = kind(**flag_values(kind, args))
            continue
        flag_field = _flag_field(cls, field, kind)
        if flag_field is None:
            continue
        spec, value = flag_field.spec, getattr(args, flag_field.name)
        if value is None and spec is not None and spec.derived:
            continue
        if value is not None and spec is not None and spec.parse is not None:
            value = spec.parse(value)
        values[field.name] = value
    return values
