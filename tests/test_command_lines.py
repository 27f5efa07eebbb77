"""Command lines a data engineer can trust: strict flags on every entry point, full --help,
Beam's options passed through, and progress on a terminal."""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import logging
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.command_line import (
    COMMAND_FLAGS,
    OPTION_GROUPS,
    beam_option_parser,
    parse_command_line,
)
from beam_pipelines.config import ImagesToTFRecordOptions, PipelineConfig, config_from_options
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.progress import ProgressReporter, ProgressSpec
from cliflags import StrictArgumentParser, suggest_flag, unknown_flags
from tests.fixtures.images import make_image_tree

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


# --- the strict parser ---------------------------------------------------------------------------


def test_suggestions_cover_dashes_typos_and_case():
    known = ["--num_shards", "--encoding", "--steps", "--epochs", "--json"]
    assert suggest_flag("--num-shards", known) == "--num_shards"
    assert suggest_flag("--encodng", known) == "--encoding"
    assert suggest_flag("--stpes", known) == "--steps"
    assert suggest_flag("--JSON", known) == "--json"
    assert suggest_flag("--encodng=raw", known) == "--encoding"
    assert suggest_flag("--zzzzzz", known) is None


def test_unknown_flags_skips_values_negative_numbers_and_everything_after_the_separator():
    argv = ["pos", "--steps", "-5", "--encodng=raw", "-x", "--", "--not_a_flag"]
    assert unknown_flags(argv, {"--steps"}) == ["--encodng", "-x"]


def _parser() -> StrictArgumentParser:
    parser = StrictArgumentParser(prog="tool")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int)
    length.add_argument("--epochs", type=int)
    roles = parser.add_subparsers(dest="role")
    worker = roles.add_parser("worker")
    worker.add_argument("--port", type=int)
    return parser


def test_an_unknown_flag_is_named_before_a_missing_required_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["--stpes", "5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: unrecognized flag --stpes\ndid you mean --steps?" in err
    assert "required" not in err


def test_abbreviations_are_not_accepted(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--step", "5"])
    assert "did you mean --steps?" in capsys.readouterr().err


def test_a_subcommand_checks_its_own_flags(capsys):
    assert _parser().parse_args(["--steps", "1", "worker", "--port", "3"]).port == 3
    with pytest.raises(SystemExit):
        _parser().parse_args(["--steps", "1", "worker", "--prot", "3"])
    assert "did you mean --port?" in capsys.readouterr().err


def _service_error(argv: list[str], capsys) -> list[str]:
    from tfrecord_io.service.server import command_line_parser

    with pytest.raises(SystemExit) as exit_info:
        command_line_parser().parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err.splitlines()


def test_suggestions_come_from_the_chosen_subcommands_flags_first(capsys):
    from tfrecord_io.service.server import command_line_parser

    prog = command_line_parser().prog
    # The dispatcher's port, not the worker's --dispatcher (a close spelling, of another role).
    err = _service_error(["dispatcher", "--dispatcher_prot", "5"], capsys)
    assert err[-2:] == [
        f"{prog} dispatcher: error: unrecognized flag --dispatcher_prot",
        "did you mean --port?",
    ]
    assert err[0].startswith(f"usage: {prog} dispatcher ")
    # In the worker, the worker's own --dispatcher is the close one.
    assert _service_error(["worker", "--dispatcher_prot", "5"], capsys)[-1] == (
        "did you mean --dispatcher?"
    )
    # Before any subcommand: the subcommand the flag names, with its flag.
    assert _service_error(["--dispatcher_prot", "5"], capsys)[-1] == (
        f"did you mean {prog} dispatcher --port?"
    )
    assert _service_error(["--port", "5", "dispatcher"], capsys)[-1] == (
        f"did you mean {prog} {{dispatcher,worker}} --port? (a subcommand's flags follow it)"
    )
    # Another role's flag is named as such.
    assert _service_error(["worker", "--dispatcher", "h:1", "--work_dir", "d"], capsys)[-1] == (
        f"--work_dir is a flag of dispatcher; see {prog} worker --help"
    )
    assert _service_error(["dispatcher", "--port", "0", "--work-dir", "d"], capsys)[-1] == (
        "did you mean --work_dir?"
    )
    parsed = command_line_parser().parse_args(["dispatcher", "--port", "0", "--work_dir", "d"])
    assert (parsed.role, parsed.port, parsed.work_dir) == ("dispatcher", 0, "d")


def test_a_flag_named_in_flag_hints_gets_its_hint_not_a_suggestion(capsys):
    parser = StrictArgumentParser(prog="tool")
    parser.add_argument("--model_dir")
    parser.flag_hints["--resume"] = "rerun to resume"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model_dir", "m", "--Resume=1"])
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "tool: error: unrecognized flag --Resume",
        "rerun to resume",
    ]


def test_a_qualified_flag_is_matched_without_its_qualifier_among_the_commands_own():
    own = {"--port", "--work_dir"}
    assert suggest_flag("--dispatcher_prot", own | {"--dispatcher"}, first=own) == "--port"
    assert suggest_flag("--zzz_yyy", own, first=own) is None


# --- every entry point ---------------------------------------------------------------------------

# (module, argv with one misspelled flag, the flag it should suggest). "OUT" is a path the
# command would write to, "IN" a directory of images.
MISSPELLED = [
    ("beam_pipelines.images_to_tfrecord", ["--input", "IN", "--output", "OUT", "--encodng", "raw"], "--encoding"),
    ("beam_pipelines.images_to_tfrecord", ["--input", "IN", "--output", "OUT", "--num-shards", "3"], "--num_shards"),
    ("beam_pipelines.images_to_tfrecord", ["--input", "IN", "--output", "OUT", "--direct_num_worker", "2"], "--direct_num_workers"),
    ("beam_pipelines.samples", ["--output", "OUT", "--per-class", "3"], "--per_class"),
    ("dataset_tools.verify", ["IN", "--jsn"], "--json"),
    ("tfrecord_io.service", ["dispatcher", "--port", "0", "--work-dir", "OUT"], "--work_dir"),
    ("tfrecord_io.service", ["dispatcher", "--dispatcher_prot", "0"], "--port"),
    ("trainer.train", ["--data", "IN", "--model_dir", "OUT", "--stpes", "5"], "--steps"),
    ("trainer.diagnose", ["OUT", "--treshold", "input_wait=0.1"], "--threshold"),
    ("dataset_tools.diff", ["IN", "OUT", "--limt", "3"], "--limit"),
    ("dataset_tools.adopt", ["IN/*.tfrecord", "--output", "OUT", "--label-offset", "1"], "--label_offset"),
    ("dataset_tools.inspect", ["IN", "--out", "OUT", "--fail-on-leakage"], "--fail_on_leakage"),
    ("beam_pipelines.versions", ["OUT", "--set-latest", "v0001"], "--set_latest"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("module", "argv", "suggestion"), MISSPELLED)
def test_a_misspelled_flag_exits_2_with_a_suggestion_and_writes_nothing(
    tmp_path, module, argv, suggestion
):
    images = tmp_path / "images"
    make_image_tree(images, {"a": 2, "b": 2}, size=(16, 16))
    out = tmp_path / "out"
    argv = [a.replace("IN", str(images)).replace("OUT", str(out)) for a in argv]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    done = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"did you mean {suggestion}?" in done.stderr.splitlines(), done.stderr[-2000:]
    assert done.stdout == ""
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not out.exists()


# --- the pipeline's --help and Beam pass-through -------------------------------------------------


def _pipeline_flags() -> list[str]:
    parser = argparse.ArgumentParser()
    ImagesToTFRecordOptions._add_argparse_args(parser)
    return [a.option_strings[0] for a in parser._actions if a.option_strings[0] != "-h"]


def test_help_lists_every_pipeline_option_in_its_group_then_where_beams_are(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_command_line(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in (*_pipeline_flags(), *COMMAND_FLAGS):
        assert f"  {flag}" in out, flag
    grouped = [flag for flags in OPTION_GROUPS.values() for flag in flags]
    assert sorted(grouped) == sorted(_pipeline_flags()), "every option has a help group"
    assert "other options" not in out
    headings = [out.index(f"\n{title}:\n") for title in OPTION_GROUPS]
    assert headings == sorted(headings)  # input, image, sharding, quality gates, output
    assert "pass through to Beam: list them with --help_beam" in out.replace("\n", " ")
    with pytest.raises(SystemExit):
        parse_command_line(["--help_beam"])
    beam_help = capsys.readouterr().out
    assert "--runner" in beam_help and "--direct_num_workers" in beam_help


def test_each_pipeline_flag_is_a_config_field_with_the_same_default(tmp_path):
    # The flags are generated from PipelineConfig's and ImageOptions' fields: the defaults of
    # the command line build the dataclasses' own defaults, parsed text (--background) included.
    options = PipelineOptions(["--input", str(tmp_path / "i"), "--output", str(tmp_path / "o")])
    expected = PipelineConfig(input=str(tmp_path / "i"), output=str(tmp_path / "o"))
    assert config_from_options(options) == expected
    fields = {f.name for f in dataclasses.fields(PipelineConfig) if f.name != "image"}
    fields |= {f.name for f in dataclasses.fields(ImageOptions)}
    assert sorted(f"--{name}" for name in fields) == sorted(_pipeline_flags())


def test_beam_options_pass_through_and_command_flags_stay_with_the_command():
    argv = ["--input", "I", "--output", "O", "--runner", "DirectRunner"]
    argv += ["--direct_num_workers=2", "--json", "--progress", "log", "--temp_location", "/t"]
    args, pipeline_argv = parse_command_line(argv)
    assert (args.json, args.progress, args.input) == (True, "log", "I")
    assert pipeline_argv == [
        "--input", "I", "--output", "O", "--runner", "DirectRunner",
        "--direct_num_workers=2", "--temp_location", "/t",
    ]  # fmt: skip


def test_progress_is_logged_periodically_off_a_terminal(caplog):
    reporter = ProgressReporter(ProgressSpec("run", "log", interval_s=0.05))
    with caplog.at_level(logging.INFO, logger="beam_pipelines.progress"):
        reporter.add(prepared=2)
        time.sleep(0.06)
        reporter.add(rejected=1)
        reporter.add(prepared=1)  # within the interval: no second line yet
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("images 3 (") and "/s), rejected 1, " in line


def test_dask_options_are_known_when_used():
    assert (
        "--dask_client_address"
        in beam_option_parser(["--dask_client_address", "x:1"])._option_string_actions
    )
    args, _ = parse_command_line(
        ["--input", "I", "--output", "O", "--dask_client_address", "tcp://h:8786"]
    )
    assert args.input == "I"


# --- progress on a terminal ----------------------------------------------------------------------


def _run_on_a_terminal(
    argv: list[str], env: dict[str, str], timeout: float = 300
) -> tuple[int, str]:
    """Runs a command with stdin/stdout/stderr on a pseudo-terminal; returns (status, output)."""
    leader, follower = pty.openpty()
    # A terminal has a size (a fresh pseudo-terminal's is 0x0, where tqdm draws nothing).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, stdin=follower, stdout=follower, stderr=follower, close_fds=True
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the terminal closed with the process
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    os.close(leader)
    status = process.wait(timeout=30)
    return status, b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_the_pipeline_shows_a_progress_bar_and_a_summary_on_a_terminal(tmp_path):
    images = tmp_path / "images"
    make_image_tree(images, {"cat": 6, "dog": 6}, size=(32, 32))
    (images / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    output = tmp_path / "dataset"
    temp = tmp_path / "tmp"  # the run's system temp dir: Beam's launcher litters it
    temp.mkdir()
    status, text = _run_on_a_terminal(
        [sys.executable, "-m", "beam_pipelines.images_to_tfrecord", "--input", str(images)]
        + ["--output", str(output), "--num_shards", "1", "--max_bad_fraction", "0.5"],
        env={**ENV, "TMPDIR": str(temp)},
    )
    assert status == 0, text[-3000:]
    assert "images:" in text and "img/s" in text and "rejected 1" in text  # the tqdm bar
    # The closing summary; its rate is over images, and broken.jpg is not one (not_an_image).
    assert "13 inputs (12 images) in" in text and "images/s" in text
    assert "top rejection reasons:" in text
    assert f"published: {output / 'dataset.json'}" in text
    assert list(temp.iterdir()) == []  # no beam-temp*, tmp* or caches left behind


def test_reading_beams_options_leaves_logging_to_the_command():
    # Beam's PipelineOptions() calls logging.basicConfig(); a handler left behind would give
    # the command's log lines Python's default format (in a fresh process: pytest's own
    # handlers would make basicConfig a no-op here).
    code = (
        "import logging\n"
        "from beam_pipelines.command_line import parse_command_line\n"
        "parse_command_line(['--input', 'I', '--output', 'O', '--runner', 'FlinkRunner'])\n"
        "print(logging.getLogger().handlers)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "[]", out
