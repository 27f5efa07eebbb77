"""Coverage-guided fuzzing of ``prepare_image`` with atheris (libFuzzer for Python).

Every input must end prepared or rejected with a reason code, inside the decode budgets: a
crash, an ``internal_error``, more address space than ``--decode_memory_mb`` (the process runs
under ``RLIMIT_AS``) or longer than the time budget per input is a finding. libFuzzer writes each
finding to the artifact directory; ``tests/test_fuzz.py`` runs a short session in the suite
and replays ``tests/fuzz_corpus/`` (where findings are kept once understood).

The longer run, from the repository root (findings land in ``tests/fuzz_corpus/``)::

  python -m tests.fuzz_prepare --seconds 1800 --artifacts tests/fuzz_corpus

Seeds: one small file per accepted format (``seed_files``): written by Pillow, or framed by
``tests/fixtures/odd_images.py`` for the formats Pillow only reads; mutated from there. The PCD
seed is 768 KB (the format's fixed layout), so the fuzzer, limited to 64 KB inputs, mutates its
header and first sectors.
"""

from __future__ import annotations

import argparse
import resource
import struct
import sys
import tempfile
import types
from pathlib import Path

__all__ = ["MEMORY_MB", "TIME_S", "OPTIONS_KW", "seed_files", "check_one", "main"]

MEMORY_MB = 1536  # --decode_memory_mb's default
TIME_S = 10  # per input; libFuzzer reports a slower one as a timeout
OPTIONS_KW = {"image_size": 32, "max_pixels": 20_000_000, "small_images": "upscale"}


def _made_by_hand(rgb) -> dict[str, bytes]:
    """Seeds for formats Pillow reads but does not write."""
    from tests.fixtures.images import encode

    width, height = rgb.size
    pixels = rgb.tobytes()
    pcx = encode(rgb, "PCX")
    sun = struct.pack(">8I", 0x59A66A95, width, height, 24, len(pixels), 1, 0, 0)
    bgr = b"".join(pixels[i : i + 3][::-1] for i in range(0, len(pixels), 3))
    gray = rgb.convert("L")
    gbr = struct.pack(">IIIIII", 28 + 5, 2, width, height, 1, 0x47494D50) + struct.pack(">I", 10)
    return {
        "dcx": struct.pack("<III", 987654321, 12, 0) + pcx,
        "sun": sun + bgr,
        "xvthumb": b"P7 332\n#END_OF_COMMENTS\n"
        + f"{width} {height} 255\n".encode()
        + bytes(rgb.convert("L").tobytes()),
        "gbr": gbr + b"seed\0" + gray.tobytes(),
    }


def seed_files() -> dict[str, bytes]:
    """name -> bytes: the fixtures' format zoo, the common formats and the hand-made ones."""
    from tests.fixtures.images import encode
    from tests.fixtures.odd_images import format_zoo, unwritable_format_files, zoo_rgb

    rgb = zoo_rgb()
    seeds = {name: data for name, (data, _, _) in format_zoo().items()}
    seeds.update((name, data) for name, (data, _) in unwritable_format_files().items())
    for fmt in ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF"):
        seeds[fmt.lower()] = encode(rgb, fmt)
    seeds.update(_made_by_hand(rgb))
    return seeds


def check_one(data: bytes) -> None:
    """Prepares ``data`` in process; returns if it is prepared or rejected for a reason.

    Raises:
      AssertionError: for an ``internal_error`` (an exception nothing expected).
    """
    from beam_pipelines.image.options import ImageOptions
    from beam_pipelines.image.prepare import RejectedImage, prepare_image

    try:
        prepare_image(data, ImageOptions(**OPTIONS_KW))
    except RejectedImage as e:
        if e.reason == "internal_error":
            raise AssertionError(f"internal_error: {e.detail}") from e


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="how long to fuzz")
    parser.add_argument("--artifacts", default=".", help="where libFuzzer writes findings")
    parser.add_argument("--corpus", default=None, help="a corpus directory (default: fresh)")
    args = parser.parse_args(argv)
    import atheris

    # The image modules without beam_pipelines/__init__ (Apache Beam: slow to instrument and
    # nothing the fuzzer should explore), as the decode worker imports them.
    root = Path(__file__).resolve().parents[1]
    package = types.ModuleType("beam_pipelines")
    package.__path__ = [str(root / "beam_pipelines")]
    sys.modules.setdefault("beam_pipelines", package)
    with atheris.instrument_imports(include=["PIL", "beam_pipelines"]):
        from PIL import Image

        Image.init()  # the plugins: Python, so coverage guides the fuzzer through them
        import beam_pipelines.image.prepare  # noqa: F401
    corpus = Path(args.corpus or tempfile.mkdtemp(prefix="fuzz_corpus_"))
    corpus.mkdir(parents=True, exist_ok=True)
    for name, data in seed_files().items():
        (corpus / f"seed_{name}").write_bytes(data)
    budget = MEMORY_MB * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (budget, budget))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    Image.MAX_IMAGE_PIXELS = OPTIONS_KW["max_pixels"] // 2 + 1  # as the decode worker sets it
    fuzzer_args = [
        sys.argv[0],
        f"-max_total_time={args.seconds}",
        f"-timeout={TIME_S}",
        # Memory is bounded by RLIMIT_AS above, not by libFuzzer's RSS check: that reads
        # getrusage's peak RSS, which Linux carries over exec from the process that started
        # this one (a pytest worker past 1.5 GB made every input an "out-of-memory").
        "-rss_limit_mb=0",
        f"-artifact_prefix={Path(args.artifacts).resolve()}/",
        "-max_len=65536",
        str(corpus),
    ]
    atheris.Setup(fuzzer_args, check_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
