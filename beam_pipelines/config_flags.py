"""Command-line flags declared on the fields of config dataclasses: each flag written once.

A field carries its flag in its metadata (``metadata=flag(help=..., group=...)``); its name,
type and default come from the field itself. From that one declaration ``add_flags`` defines
the argparse arguments (Beam's ``PipelineOptions`` takes them through ``_add_argparse_args``,
``--help`` lists them by group) and ``from_flags`` builds the dataclass from the parsed values,
so that the dataclass's ``__post_init__`` is the one place values are checked. A field whose
type is itself a dataclass (``PipelineConfig.image``) contributes that dataclass's flags.

Imports nothing of the project, so that any config module (``image.options``, ``config``) can
declare its flags here without an import cycle.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

__all__ = ["Flag", "flag", "flag_fields", "flag_groups", "add_flags", "from_flags"]

_METADATA_KEY = "flag"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flag:
    """How one dataclass field appears on the command line.

    Attributes:
      help: the ``--help`` text; ``%(default)s`` stands for the flag's default.
      group: the ``--help`` section the flag is listed in.
      choices: the values the flag accepts, or None for any value of its type.
      parse: turns the flag's text into the field's value (for example ``#ffffff`` into an RGB
        tuple, or a path into an absolute one); None when the flag's type is the field's.
      text_default: the flag's default as typed on the command line, for a field with
        ``parse``; the field's own default otherwise.

    Raises:
      ValueError: for an empty help text or group.
    """

    help: str
    group: str
    choices: tuple[str, ...] | None = None
    parse: Callable[[Any], Any] | None = None
    text_default: str | None = None

    def __post_init__(self) -> None:
        if not self.help or not self.group:
            raise ValueError(f"a flag needs a help text and a group, got {self!r}")


def flag(
    *,
    help: str,
    group: str,
    choices: Sequence[str] | None = None,
    parse: Callable[[Any], Any] | None = None,
    text_default: str | None = None,
) -> dict[str, Flag]:
    """Field metadata that makes the field a flag: ``dataclasses.field(metadata=flag(...))``."""
    spec = Flag(
        help=help,
        group=group,
        choices=None if choices is None else tuple(choices),
        parse=parse,
        text_default=text_default,
    )
    return {_METADATA_KEY: spec}


def _nested(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def flag_fields(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Flag, Any]]:
    """Every ``(field, flag, field type)`` of ``cls``, nested dataclasses' flags in their place.

    Fields without a flag and of no dataclass type are left out: they are not on the command
    line and keep their defaults.
    """
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        spec = field.metadata.get(_METADATA_KEY)
        if spec is not None:
            yield field, spec, hints[field.name]
        elif _nested(hints[field.name]):
            yield from flag_fields(hints[field.name])


def flag_groups(cls: type, titles: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--help`` group title -> its flags, in field order, for every title in ``titles``.

    Raises:
      ValueError: naming a flag whose group is not one of ``titles``.
    """
    groups: dict[str, list[str]] = {title: [] for title in titles}
    for field, spec, _ in flag_fields(cls):
        if spec.group not in groups:
            raise ValueError(
                f"--{field.name} is in help group {spec.group!r}, not one of {list(titles)}"
            )
        groups[spec.group].append(f"--{field.name}")
    return {title: tuple(flags) for title, flags in groups.items()}


def _argument_options(field: dataclasses.Field[Any], spec: Flag, kind: Any) -> dict[str, Any]:
    """``add_argument`` keywords for one field's flag."""
    default = None if field.default is dataclasses.MISSING else field.default
    options: dict[str, Any] = {"help": spec.help}
    if spec.parse is not None:  # the flag takes text; ``parse`` makes the field's value
        options["default"] = spec.text_default
    elif kind is bool:
        options.update(action="store_true", default=default)
    else:
        options["default"] = default
        base = next(t for t in typing.get_args(kind) or (kind,) if t is not type(None))
        if base is not str:
            options["type"] = base
    if spec.choices is not None:
        options["choices"] = spec.choices
    return options


class _ArgumentAdder(Protocol):
    def add_argument(self, *names: str, **options: Any) -> Any: ...


def add_flags(
    parser: _ArgumentAdder, cls: type, groups: Mapping[str, _ArgumentAdder] | None = None
) -> None:
    """Defines a ``--<field>`` argument for each flag field of ``cls``.

    Args:
      parser: an argparse parser (or anything with its ``add_argument``).
      cls: the config dataclass.
      groups: title -> argument group, to list each flag in its help group; None to add
        every flag to ``parser`` itself (Beam's options parser).

    Raises:
      KeyError: for a flag whose group is not in ``groups``.
    """
    for field, spec, kind in flag_fields(cls):
        target = parser if groups is None else groups[spec.group]
        target.add_argument(f"--{field.name}", **_argument_options(field, spec, kind))


def from_flags(cls: type, values: Any) -> Any:
    """Builds ``cls`` from parsed flags: ``values`` has an attribute per flag field.

    Each flag's value goes through its ``parse``; a nested dataclass field is built from its own
    flags first. The dataclasses' ``__post_init__`` check the values.

    Raises:
      ValueError: from ``parse`` or a dataclass's checks, naming the bad value.
    """
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        spec = field.metadata.get(_METADATA_KEY)
        if spec is not None:
            value = getattr(values, field.name)
            kwargs[field.name] = value if spec.parse is None else spec.parse(value)
        elif _nested(hints[field.name]):
            kwargs[field.name] = from_flags(hints[field.name], values)
    return cls(**kwargs)
