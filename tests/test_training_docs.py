"""The examples of docs/training.md run as written, on the session's small dataset.

Every fenced block of the page is checked: the files it quotes (``QUOTED``: the model file,
the two-worker ``fit``, which tests/test_fit_callback.py runs) must be quoted verbatim, and
every other block runs, each as a program of its own, in a directory where ``out/dataset`` is the session's ``pipeline_dataset`` (14 training
examples, 3 classes, 32 px). The page gives sizes for a GPU cluster; ``SMALL`` swaps them for
ones that fit 14 examples and a few steps, and each swap must still find its text on the page,
so an edited example cannot slip past the test. ``python -m MODULE ARGS`` lines run as
``MODULE.main(ARGS)`` in this process (what ``python -m`` runs, without another TensorFlow
start-up per line); Python blocks run with ``exec``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "training.md"
MODEL_FILE = REPO / "tests" / "models" / "my_model.py"
# Files the page quotes rather than runs.
QUOTED = [MODEL_FILE, REPO / "tests" / "models" / "fit_on_workers.py"]

# The page's sizes -> a few steps on 14 examples. Each left side must occur on the page.
SMALL = {
    "--global_batch_size 32": "--global_batch_size 2",
    "--steps 300": "--steps 2",
    "--warmup_steps 20": "--warmup_steps 1",
    "--eval_every 50": "--eval_every 1",
    "--model_arg width=32": "--model_arg width=4",
    "steps=300": "steps=2",
    "global_batch_size=32": "global_batch_size=2",
    '"width": 32': '"width": 4',
    "save_freq=50": "save_freq=2",
    "epochs=10": "epochs=1",
    # The images to classify: those the session's dataset was built from.
    "exported/a/1 photos/": "exported/a/1 out/dataset/../images/",
}


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced code block of the page."""

    language: str
    line: int  # of the opening fence, 1-based
    code: str


def fenced_blocks(text: str) -> list[Block]:
    """The page's fenced code blocks, in order."""
    blocks = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(match.group(1), line, match.group(2)))
    return blocks


def _body(path: Path) -> str:
    """A file without its module docstring, as the page quotes it."""
    source = path.read_text()
    docstring = re.match(r'"""(.*?)"""\n\n', source, flags=re.S)
    assert docstring, f"{path} should open with its docstring"
    return source[docstring.end() :]


def _is_quoted(block: Block) -> bool:
    return any(block.code in _body(path) for path in QUOTED)


def _small(code: str) -> str:
    for page_text, small in SMALL.items():
        code = code.replace(page_text, small)
    return code


def _commands(code: str) -> list[list[str]]:
    """The ``python -m MODULE ARGS`` commands of a shell block, continuation lines joined."""
    joined = code.replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.strip()]


def _run_shell(block: Block) -> None:
    for command in _commands(_small(block.code)):
        where = f"{PAGE.name}:{block.line}: {shlex.join(command)}"
        assert command[:2] == ["python", "-m"], f"{where}: only python -m commands are run"
        module = importlib.import_module(command[2])
        assert module.main(command[3:]) == 0, where


def _run_python(block: Block) -> None:
    program = compile(_small(block.code), f"{PAGE.name}:{block.line}", "exec")
    exec(program, {"__name__": "__main__"})


def test_the_page_quotes_its_files_verbatim():
    python = [b.code for b in fenced_blocks(PAGE.read_text()) if b.language == "python"]
    assert _body(MODEL_FILE) in python  # the whole model file
    for path in QUOTED:
        assert any(code in _body(path) for code in python), f"{path} is not quoted verbatim"


def test_every_block_is_of_a_language_the_runner_knows():
    text = PAGE.read_text()
    assert fenced_blocks(text), "no code block found: has the fence syntax changed?"
    for block in fenced_blocks(text):
        assert block.language in ("bash", "python"), f"{PAGE.name}:{block.line}: {block}"
    for page_text in SMALL:
        assert page_text in text, f"{page_text!r} is no longer on the page: update SMALL"


@pytest.mark.slow
def test_the_examples_run_as_written(pipeline_dataset, tmp_path, monkeypatch, capsys):
    import keras
    import tensorflow as tf

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "dataset").symlink_to(pipeline_dataset)
    monkeypatch.chdir(tmp_path)
    ran = []
    for block in fenced_blocks(PAGE.read_text()):
        if _is_quoted(block):
            continue  # the model file (the others import it), the two-worker fit
        try:
            if block.language == "bash":
                _run_shell(block)
            else:
                _run_python(block)
        finally:
            # Each block is a program of its own: no global seed or precision policy is left
            # for the next (the reader's exact epochs cannot be built under a global seed).
            tf.random.set_seed(None)
            keras.config.set_dtype_policy("float32")
        ran.append(block.line)
    assert len(ran) >= 4, ran
    for run in ("runs/a", "runs/mine", "runs/api"):
        assert list((tmp_path / run / "checkpoints").glob("ckpt-*.index")), run
    assert (tmp_path / "exported" / "a" / "1" / "saved_model.pb").is_file()  # export ran
    # BackupAndRestore deletes its backup at the end of fit; the delivered sets stay.
    assert list((tmp_path / "runs" / "fit" / "delivered").glob("delivered-*.bin"))
    out = capsys.readouterr().out
    assert "gradient norm" in out, out  # diagnose printed its verdicts
