"""``cliflags.dataclass_flags``: a config dataclass generates its flags, each written once."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from cliflags import (
    NESTED_FLAGS,
    NO_FLAG,
    Flag,
    add_dataclass_flags,
    field_docs,
    flag,
    flag_groups,
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


# --- help groups, text parsed into values, nested configs (the pipeline's flags) ----------------


def _rgb(text: str) -> tuple[int, int, int]:
    if not text.startswith("#") or len(text) != 7:
        raise ValueError(f"colour must look like '#ffffff', got {text!r}")
    return (int(text[1:3], 16), int(text[3:5], 16), int(text[5:7], 16))


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Inner:
    size: int = dataclasses.field(default=4, metadata=flag("side (%(default)s)", group="image"))
    colour: tuple[int, int, int] = dataclasses.field(
        default=(255, 255, 255),
        metadata=flag(
            "background (%(default)s)", group="image", parse=_rgb, text_default="#ffffff"
        ),
    )

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Outer:
    source: str = dataclasses.field(metadata=flag("input", group="input", parse=str.upper))
    inner: _Inner = dataclasses.field(default_factory=_Inner, metadata=NESTED_FLAGS)
    base: str | None = dataclasses.field(
        default=None, metadata=flag("a base", group="input", show_default=False)
    )
    fast: bool = dataclasses.field(default=False, metadata=flag("hurry", group="input"))


def _grouped_parser(**kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tool")
    groups = {title: parser.add_argument_group(title) for title in ("input", "image")}
    add_dataclass_flags(parser, _Outer, groups=groups, **kwargs)
    return parser


def test_flags_go_to_their_help_groups_with_the_default_where_the_help_places_it():
    assert flag_groups(_Outer, ("input", "image")) == {
        "input": ("--source", "--base", "--fast"),
        "image": ("--size", "--colour"),
    }
    text = " ".join(_grouped_parser().format_help().split())
    assert "input: --source SOURCE input --base BASE a base --fast hurry (default: False)" in text
    assert "image: --size SIZE side (4) --colour COLOUR background (#ffffff)" in text
    with pytest.raises(
        ValueError, match=r"--source is in help group 'input', not one of \['image'\]"
    ):
        flag_groups(_Outer, ("image",))
    with pytest.raises(ValueError, match="--data is in help group None"):
        add_dataclass_flags(argparse.ArgumentParser(), _Config, groups={})


def test_parse_turns_the_text_into_the_value_and_a_nested_config_is_built_from_its_flags():
    args = _grouped_parser().parse_args(["--source", "s", "--colour", "#102030", "--size", "2"])
    config = _Outer(**flag_values(_Outer, args))
    assert config == _Outer(source="S", inner=_Inner(size=2, colour=(16, 32, 48)))
    defaults = _Outer(**flag_values(_Outer, _grouped_parser().parse_args(["--source", "s"])))
    assert defaults.inner == _Inner() and defaults.base is None  # the text default, parsed
    with pytest.raises(ValueError, match="colour must look like '#ffffff', got 'red'"):
        flag_values(_Outer, _grouped_parser().parse_args(["--source=s", "--colour=red"]))
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        flag_values(_Outer, _grouped_parser().parse_args(["--source=s", "--size=0"]))


def test_a_field_without_default_is_required_unless_the_parser_must_do_without(capsys):
    with pytest.raises(SystemExit):
        _grouped_parser().parse_args([])
    assert "the following arguments are required: --source" in capsys.readouterr().err
    unset = _grouped_parser(enforce_required=False).parse_args([])
    assert (
        flag_values(_Outer, unset)["source"] is None
    )  # not parsed: the caller says what's missing


def test_contradicting_flag_settings_are_refused():
    with pytest.raises(ValueError, match="text_default '#fff' needs a parse function"):
        flag("x", text_default="#fff")
    with pytest.raises(ValueError, match="show_default=False shows no default"):
        flag("x", show_default=False, default_text="none")

    @dataclasses.dataclass
    class NotNested:
        value: int = dataclasses.field(default=0, metadata=NESTED_FLAGS)

    with pytest.raises(TypeError, match="'value' is marked NESTED_FLAGS"):
        add_dataclass_flags(argparse.ArgumentParser(), NotNested)
