"""The one use of Pillow's C core (``beam_pipelines.image.pillow_blocks``): if Pillow renames
or drops it, these fail and name the change."""

from __future__ import annotations

import os
import subprocess
import sys

from PIL import Image

from beam_pipelines.image import pillow_blocks
from beam_pipelines.image.bounds import BoundedPreparer
from beam_pipelines.image.prepare import ImageOptions, prepare_image
from tests.fixtures.images import jpeg_bytes


def _blocks_max_in_a_fresh_process(code: str, env_value: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != pillow_blocks.PILLOW_VARIABLE}
    if env_value is not None:
        env[pillow_blocks.PILLOW_VARIABLE] = env_value
    script = f"{code}\nfrom PIL import Image\nprint(Image.core.get_blocks_max())"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


def test_pillow_still_has_the_block_pool_switch_it_applies_its_variable_with():
    assert hasattr(Image.core, "set_blocks_max") and hasattr(Image.core, "get_blocks_max"), (
        "Pillow's C core no longer has set_blocks_max/get_blocks_max: apply "
        "PILLOW_BLOCKS_MAX some other way in beam_pipelines/image/pillow_blocks.py"
    )


def test_an_in_process_preparer_keeps_freed_blocks_and_its_images_come_out_the_same():
    code = (
        "from beam_pipelines.image.bounds import BoundedPreparer\n"
        "from beam_pipelines.image.prepare import ImageOptions\n"
        "BoundedPreparer(ImageOptions())"
    )
    assert _blocks_max_in_a_fresh_process("", None) == 0  # Pillow's default: none kept
    assert _blocks_max_in_a_fresh_process(code, None) == pillow_blocks.KEPT_BLOCKS
    data = jpeg_bytes((500, 375), seed=3)
    kept = BoundedPreparer(ImageOptions()).prepare(data)
    saved = Image.core.get_blocks_max()
    try:
        Image.core.set_blocks_max(0)
        plain = prepare_image(data, ImageOptions())
    finally:
        Image.core.set_blocks_max(saved)
    assert (kept.encoded, kept.luma_sample) == (plain.encoded, plain.luma_sample)


def test_a_users_own_variable_wins():
    code = "from beam_pipelines.image import pillow_blocks\npillow_blocks.keep_freed_blocks()"
    assert _blocks_max_in_a_fresh_process(code, "3") == 3
