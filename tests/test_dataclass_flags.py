"""``cliflags.dataclass_flags``: a config dataclass generates its flags, each written once."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from cliflags.dataclass_flags import (
    NO_FLAG,
    Flag,
    add_dataclass_flags,
    field_docs,
    flag,
    flag_values,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Config:
    """A config.

    Attributes:
      documented: described only here, in the docstring.
    """

    source: str = dataclasses.field(metadata=flag("where to read", name="data"))
    size: int = dataclasses.field(default=8, metadata=flag("side", derived="what the data stores"))
    mode: str = dataclasses.field(default="a", metadata=flag("the mode", choices=("a", "b")))
    limit: int | None = dataclasses.field(
        default=None, metadata=flag("at most", default_text="no limit")
    )
    steps: int | None = dataclasses.field(default=None, metadata=flag("steps", one_of="length"))
    epochs: int | None = dataclasses.field(default=None, metadata=flag("epochs", one_of="length"))
    verbose: bool = dataclasses.field(default=False, metadata=flag("say more"))
    tuned: bool | None = dataclasses.field(default=None, metadata=flag("tune", default_text="auto"))
    rate: float = dataclasses.field(default=0.5, metadata=flag("a rate, in %"))
    hidden: float = dataclasses.field(default=0.9, metadata=NO_FLAG)
    documented: int = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tool")
    add_dataclass_flags(parser.add_argument_group("config"), _Config)
    return parser


def test_every_field_but_the_hidden_one_is_a_flag_with_its_help_and_one_default():
    text = " ".join(_parser().format_help().split())
    assert "--data DATA where to read " in text  # required: no default
    assert "side (default: what the data stores; else 8)" in text
    assert "--mode {a,b} the mode (default: a)" in text
    assert "at most (default: no limit)" in text
    assert "--verbose say more (default: False)" in text
    assert "--tuned, --no-tuned tune (default: auto)" in text
    assert "a rate, in % (default: 0.5)" in text
    assert "described only here, in the docstring. (default: 3)" in text
    assert "(--steps STEPS | --epochs EPOCHS)" in text
    assert "--hidden" not in text


def test_parsed_flags_build_the_dataclass_and_an_unset_derived_field_is_left_out():
    args = _parser().parse_args(["--data", "d", "--steps", "3", "--rate", "0.25", "--no-tuned"])
    values = flag_values(_Config, args)
    assert "size" not in values
    config = _Config(**values)
    assert (config.source, config.size, config.steps, config.epochs) == ("d", 8, 3, None)
    assert (config.rate, config.tuned, config.verbose, config.hidden) == (0.25, False, False, 0.9)
    given = flag_values(_Config, _parser().parse_args(["--data=d", "--epochs=1", "--size=4"]))
    assert given["size"] == 4 and given["epochs"] == 1


def test_exactly_one_of_a_group_is_required(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--data", "d"])
    assert "one of the arguments --steps --epochs is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--data", "d", "--steps", "1", "--epochs", "1"])
    assert "not allowed with" in capsys.readouterr().err


def test_docstring_attributes_give_the_help_of_a_dataclass_without_metadata():
    assert field_docs(_Config) == {"documented": "described only here, in the docstring."}


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError, match="a flag needs a help line"):
        Flag(help="")
    with pytest.raises(ValueError, match="give derived or default_text, not both"):
        flag("x", derived="y", default_text="z")
    with pytest.raises(TypeError, match="expected a dataclass"):
        add_dataclass_flags(argparse.ArgumentParser(), int)

    @dataclasses.dataclass
    class Ambiguous:
        value: int | str = 0

    with pytest.raises(ValueError, match="'value' of Ambiguous has type"):
        add_dataclass_flags(argparse.ArgumentParser(), Ambiguous)
