"""Every decode is bounded: Pillow's own checks stay on with the limit from ``--max_pixels``
(without touching the importing program's Pillow), and a decode worker holds each image within
a memory and a time budget whatever its plugin does (``beam_pipelines.image.bounds``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from PIL import Image

from beam_pipelines.image.bounds import BoundedPreparer
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.prepare import RejectedImage, prepare_image
from tests.fixtures.images import encode
from tests.fixtures.odd_images import ico_holding, png_of_size, zero_png

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def preparers():
    made: list[BoundedPreparer] = []

    def make(**options) -> BoundedPreparer:
        made.append(BoundedPreparer(ImageOptions(**options)))
        return made[-1]

    yield make
    for preparer in made:
        preparer.close()


def test_importing_the_pipeline_leaves_pillows_limit_as_it_was():
    script = textwrap.dedent(
        """
        from PIL import Image
        default = Image.MAX_IMAGE_PIXELS
        import beam_pipelines, beam_pipelines.images_to_tfrecord, beam_pipelines.image.bounds
        from beam_pipelines.image.prepare import ImageOptions, prepare_image
        from tests.fixtures.odd_images import png_of_size
        assert Image.MAX_IMAGE_PIXELS == default, Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = 12_345
        prepare_image(png_of_size(100, 100), ImageOptions(image_size=32))
        assert Image.MAX_IMAGE_PIXELS == 12_345, Image.MAX_IMAGE_PIXELS
        print("unchanged")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "unchanged", done.stderr


def _tiff(width: int, height: int) -> bytes:
    return encode(Image.new("RGB", (width, height), (9, 99, 199)), "TIFF")


def test_the_worker_prepares_exactly_what_prepare_image_does(preparers):
    options = dict(image_size=32, encoding="png")
    preparer = preparers(**options)
    # JPEG, PNG and WebP are prepared in this process: their decoders allocate only what the
    # header declares, which --max_pixels bounds. No worker is started for them.
    for data in (png_of_size(80, 60), encode(Image.new("RGBA", (40, 50), (1, 2, 3, 4)), "PNG")):
        assert preparer.prepare(data) == prepare_image(data, ImageOptions(**options))
    assert preparer._child is None
    for data in (_tiff(80, 60), ico_holding(png_of_size(48, 40))):
        assert preparer.prepare(data) == prepare_image(data, ImageOptions(**options))
    assert preparer._child is not None
    with pytest.raises(RejectedImage) as info:
        preparer.prepare(b"not an image at all")
    assert info.value.reason == "not_an_image"


def test_pillows_own_checks_run_in_the_worker_with_the_limit_from_max_pixels(preparers):
    # Pillow's message, not ours: its check (the one its plugins also make inside load())
    # fired, with the limit --max_pixels sets in the worker.
    preparer = preparers(max_pixels=10_000_000)
    start = time.monotonic()
    with pytest.raises(RejectedImage) as info:
        preparer.prepare(ico_holding(zero_png(5_000, 5_000)))
    assert info.value.reason == "too_many_pixels", info.value
    assert "exceeds limit of 10000000 pixels" in info.value.detail
    assert time.monotonic() - start < 5
    assert preparer.prepare(_tiff(64, 64)).width == 256  # the worker still serves


def test_a_plugin_allocating_past_the_memory_budget_is_rejected_within_the_budgets(preparers):
    # Inside --max_pixels (Pillow's check passes) but 144 MP of RGB needs 432 MB of pixels,
    # which the ICO plugin's embedded PNG decoder allocates.
    bomb = ico_holding(zero_png(12_000, 12_000))
    preparer = preparers(max_pixels=200_000_000, decode_memory_mb=400, decode_time_s=30)
    start = time.monotonic()
    with pytest.raises(RejectedImage) as info:
        preparer.prepare(bomb)
    elapsed = time.monotonic() - start
    assert info.value.reason == "over_budget", info.value
    assert "--decode_memory_mb 400" in info.value.detail
    assert elapsed < 30
    assert preparer.prepare(_tiff(64, 64)).height == 256


def test_an_image_slower_than_the_time_budget_is_stopped(preparers):
    slow = ico_holding(zero_png(8_000, 8_000))  # about a second of inflating and resizing
    preparer = preparers(max_pixels=100_000_000, decode_time_s=0.05)
    start = time.monotonic()
    with pytest.raises(RejectedImage) as info:
        preparer.prepare(slow)
    assert info.value.reason == "over_budget"
    assert "--decode_time_s 0.05" in info.value.detail
    assert time.monotonic() - start < 2
    assert preparers(decode_time_s=30).prepare(_tiff(64, 64)).height == 256


def test_a_worker_that_dies_is_a_rejection_and_the_next_image_starts_another(preparers):
    preparer = preparers(image_size=32)
    preparer.prepare(_tiff(64, 64))
    preparer._child.process.kill()  # as the kernel's OOM killer would
    with pytest.raises(RejectedImage) as info:
        preparer.prepare(_tiff(64, 64))
    assert info.value.reason == "over_budget"
    assert preparer.prepare(_tiff(64, 64)).height == 32


@pytest.mark.parametrize(
    "field, value", [("decode_memory_mb", 100), ("decode_time_s", 0), ("decode_memory_mb", 1.5)]
)
def test_budgets_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        ImageOptions(**{field: value})


_PARENT_GONE = """
import os, pickle, struct, sys
from beam_pipelines.image.options import ImageOptions
from tests.fixtures.odd_images import png_of_size

def frame(data):
    return struct.pack("!Q", len(data)) + data

options = pickle.dumps(ImageOptions(image_size=32))
worker_in_r, worker_in_w = os.pipe()
worker_out_r, worker_out_w = os.pipe()
pid = os.fork()
if pid == 0:  # the decode worker, as its parent starts it
    os.dup2(worker_in_r, 0)
    os.dup2(worker_out_w, 1)
    for fd in (worker_in_r, worker_in_w, worker_out_r, worker_out_w):
        os.close(fd)
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
os.close(worker_in_r)
os.close(worker_out_w)
os.write(worker_in_w, frame(options))
os.read(worker_out_r, 12)  # its ready frame
os.close(worker_out_r)  # the parent is gone for its answers
image = frame(png_of_size(600, 600))
cut = int(sys.argv[2])  # 0: the whole frame
os.write(worker_in_w, image[:cut] if cut else image)
os.close(worker_in_w)
print(os.waitpid(pid, 0)[1])
"""


# The bytes of the image's frame sent before the pipe closes: all of them (its answer then
# meets a broken pipe), or 100 (its input ends mid-image).
@pytest.mark.parametrize("cut", [0, 100], ids=["broken pipe", "input ends"])
def test_a_worker_whose_parent_is_gone_ends_without_a_traceback(cut):
    # An interrupted build's SDK worker dies before the decode worker answers: the decode
    # worker's write then fails with EPIPE (or its input ends mid-image). It ends quietly.
    boot = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from beam_pipelines.image.bounds import serve\nserve()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", _PARENT_GONE, boot, str(cut)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0", (done.stdout, done.stderr)  # the worker's exit status
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
