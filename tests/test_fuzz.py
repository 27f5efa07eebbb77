"""Fuzzing as a test: a short coverage-guided session over ``prepare_image`` from a seed of every
accepted format (``tests/fuzz_prepare.py``, under ``RLIMIT_AS``), and the regression corpus
(``tests/fuzz_corpus/``) replayed through the decode worker's budgets."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from beam_pipelines.image.bounds import BoundedPreparer
from beam_pipelines.image.formats import DEFAULT_ACCEPTED_FORMATS
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.prepare import RejectedImage, prepare_image
from tests.fixtures.odd_images import unwritable_format_files
from tests.fuzz_prepare import OPTIONS_KW, seed_files

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "fuzz_corpus"
SESSION_S = 15


def test_every_accepted_format_has_a_seed():
    seeded = set()
    for data in seed_files().values():
        seeded.add(Image.open(io.BytesIO(data)).format.upper())  # "XVThumb" is XVTHUMB
    assert set(DEFAULT_ACCEPTED_FORMATS) - seeded == set()


@pytest.mark.parametrize("name", sorted(unwritable_format_files()))
def test_the_hand_made_seeds_open_decode_and_prepare(name):
    """The formats Pillow cannot write are framed by hand: each must be a valid file of its
    format, or the fuzzer would start from a file its plugin refuses at once."""
    data, fmt = unwritable_format_files()[name]
    image = Image.open(io.BytesIO(data))
    assert image.format == fmt
    image.load()
    low, high = image.convert("L").getextrema()
    assert high - low > 100  # a picture, not a blank frame
    prepared = prepare_image(data, ImageOptions(**OPTIONS_KW))
    assert prepared.source_format == fmt and min(prepared.width, prepared.height) == 32
    committed = CORPUS / f"seed_{name}"
    if committed.exists():  # the small ones are in the corpus too, replayed by the worker
        assert committed.read_bytes() == data, f"rebuild {committed.name}: see the README there"


@pytest.mark.slow
def test_a_short_fuzzing_session_finds_nothing(tmp_path):
    pytest.importorskip("atheris")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_prepare", "--seconds", str(SESSION_S)]
        + ["--artifacts", str(artifacts), "--corpus", str(tmp_path / "corpus")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SESSION_S + 90,
        check=False,
    )
    log = "\n".join(line for line in done.stderr.splitlines() if "Instrumenting" not in line)
    assert done.returncode == 0, log[-4000:]
    assert "DONE" in log
    assert sorted(p.name for p in artifacts.iterdir()) == [], log[-4000:]


def test_the_regression_corpus_replays():
    files = sorted(p for p in CORPUS.iterdir() if p.name != "README.md")
    assert files
    preparer = BoundedPreparer(ImageOptions(**OPTIONS_KW))
    try:
        for path in files:
            try:
                preparer.prepare(path.read_bytes())
            except RejectedImage as e:
                assert e.reason != "internal_error", f"{path.name}: {e.detail}"
                assert e.reason != "decoder_crashed", f"{path.name}: {e.detail}"
    finally:
        preparer.close()
