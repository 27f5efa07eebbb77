"""The README's snippets, run as written.

Every fenced block of ``README.md`` is accounted for: run here as written, run by CI itself
(the two top commands: CI's ``.ci/run`` is ``scripts/test.sh``, and the quickstart's own steps
are tested one by one), or a synopsis whose every flag must be a real flag of its command.
A new block that none of these covers fails ``test_every_block_is_accounted_for``.

"Your own images" runs in a home directory of its own, with ``~/photos`` a generated folder
of two classes. Its training line is the one change: ``--steps 1000`` runs as ``--steps 3``
(the same command otherwise), since a thousand steps prove no more than three.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.images import make_image_tree
from tests.fixtures.processes import REPO
from tests.test_first_day import NOISE

README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)

# Blocks CI runs itself: the two top commands (scripts/test.sh is .ci/run).
RUN_BY_CI = "bash scripts/quickstart.sh"
ACTIVATE = "source .venv/bin/activate"
OWN_IMAGES = "tfrecord-pipeline --input ~/photos"
PIPELINE_SYNOPSIS = "python -m beam_pipelines.images_to_tfrecord --input SRC"
READER = "tfrecord_io.make_dataset("


def _blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(README.read_text(encoding="utf-8"))]


def _block(marker: str) -> str:
    found = [body for _, body in _blocks() if marker in body]
    assert len(found) == 1, f"README: {len(found)} blocks hold {marker!r}"
    return found[0]


def test_every_block_is_accounted_for() -> None:
    markers = (RUN_BY_CI, ACTIVATE, OWN_IMAGES, PIPELINE_SYNOPSIS, READER)
    for language, body in _blocks():
        if not language:
            continue  # a drawing (the layout), not code
        assert any(m in body for m in markers), f"README block not tested:\n{body}"


def _user_env(home: Path) -> dict[str, str]:
    """A user's shell after ``source .venv/bin/activate``, in a home of its own."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def own_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs "Your own images" as written in a fresh home; returns the home."""
    home = tmp_path_factory.mktemp("home")
    make_image_tree(home / "photos", {"cat": 20, "dog": 20}, size=(72, 56))
    make_image_tree(home / "new_photos", {"unsorted": 3}, size=(64, 48))
    script = _block(OWN_IMAGES)
    assert "--steps 1000" in script
    script = script.replace(ACTIVATE, f"source {Path(sys.executable).parent}/activate")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script.replace("--steps 1000", "--steps 3")],
        cwd=home,
        env=_user_env(home),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "published:" in done.stdout and "OK:" in done.stdout, done.stdout[-3000:]
    predicted = [line for line in done.stdout.splitlines() if "/new_photos/" in line]
    assert len(predicted) == 3, done.stdout[-3000:]
    assert all(line.split("\t")[1] in ("cat", "dog") for line in predicted), predicted
    return home


@pytest.mark.slow
def test_your_own_images_runs_as_written(own_images: Path) -> None:
    assert (own_images / "out" / "photos" / "dataset.json").is_file()
    checkpoints = list((own_images / "runs" / "photos").rglob("*.index"))
    assert checkpoints, "tfrecord-train wrote no checkpoint"


@pytest.mark.slow
def test_the_reader_snippet_runs_as_written(own_images: Path) -> None:
    code = _block(READER) + (
        "\nassert images.shape[0] == 32 and labels.shape == (32,), (images.shape, labels.shape)"
        "\nassert next(iter(per_replica)) is not None"
        "\nprint('read', tuple(images.shape))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=own_images,
        env=_user_env(own_images),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read (32, " in done.stdout
    # As a user's shell runs it: no TensorFlow start-up line and no warning.
    assert not NOISE.findall(done.stdout + done.stderr), done.stderr[-3000:]


def test_the_paths_your_own_images_writes_are_ignored_by_git() -> None:
    # Run in a clone, "Your own images" must not leave its datasets and runs as untracked files.
    script = _block(OWN_IMAGES)
    written = re.findall(r"--(?:output|model_dir) (\S+)", script)
    assert len(written) == 2, script
    ignored = set((REPO / ".gitignore").read_text().split())
    for path in written:
        top = path.split("/")[0]
        assert {f"/{top}/", f"{top}/", f"/{top}", top} & ignored, f"{path}: {top}/ not ignored"


def test_the_pipeline_synopsis_names_real_flags() -> None:
    from beam_pipelines.command_line import build_parser

    synopsis = _block(PIPELINE_SYNOPSIS)
    flags = set(re.findall(r"(--[a-z_]+)", synopsis))
    assert {"--input", "--output", "--runner"} <= flags
    ours = build_parser().format_help()
    beams = {"--runner", "--direct_num_workers"}  # Beam's own options, passed through
    unknown = sorted(f for f in flags - beams if not re.search(rf"{f}\b", ours))
    assert not unknown, f"README's pipeline synopsis names flags the command lacks: {unknown}"
