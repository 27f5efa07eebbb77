"""Benchmark: near-duplicate recall and precision per variant, the hash's cost, the search's speed.

Quality rows. ``N`` distinct photo-like scenes (``beam_pipelines.samples.scene_rgb``, 500x375,
JPEG q90) each get one copy per variant:

* ``jpeg_q50``, ``jpeg_q75``: the decoded original re-encoded at another quality;
* ``resize_50``: half the size (then JPEG q90);
* ``crop_5``, ``crop_10``: 5% / 10% cut from the width and the height, at a random place;
* ``brightness_+20``: +20 levels on every channel (clipped), ``brightness_x1.2``: x1.2;
* ``flip``: mirrored left-right.

Every file goes through the pipeline's own ``prepare_image`` (256 px shorter side, JPEG q90)
and is hashed as the pipeline hashes it. ``find_pairs`` then runs over all of them together
(flips on). Recall of a variant: the share of its copies paired with their original. Precision
of a variant: of the pairs that hold one of its copies, the share joining two images of the same
scene. ``distinct pairs`` counts pairs between different scenes' originals.

Cost rows:
* hash cost: the 64x64 luma sample, timed inside ``prepare_image`` where the pipeline takes
  it, plus the window hashes of all the samples at once (``image_hash.window_hashes``, as the
  pipeline runs it per staging file), against the whole ``prepare_image`` (the pipeline's CPU
  per image is larger still, with Beam's own overhead: ``bench_pipeline``);
* search: the gathered search over N examples of uniform random window hashes (four a
  example), CPU seconds and peak RSS growth in a fresh process: ``find_pairs`` on the whole
  frames alone (the search before the window rule) and ``find_window_pairs`` under the
  default rule (uniform hashes are the worst case for chance pairs and a fair one for bucket
  sizes).
* bucketed search (``--buckets``): the engine's search (``find_window_pairs_by_buckets``:
  every bucket searched with ``search_window_bucket``, as the Beam transform's workers do,
  here one after another) over the same examples, checked pair for pair against
  ``find_window_pairs`` (up to ``--compare_up_to`` examples); its CPU over all buckets, the
  largest bucket, and a worker's memory and CPU: the peak RSS of a fresh process running the
  engine's step (``SearchBuckets``) over the largest search, as packs (before and during the
  search). The largest search is the largest bucket, or one block pair of it when it is over
  ``--max_bucket_entries``.

Usage::

  python -m benchmarks.bench_near_duplicates [--n 1000] [--search 100000,1000000]
      [--buckets 1000000,3000000,10000000] [--max_bucket_entries 65536] [--quick]
"""

from __future__ import annotations

import argparse
import io
import math
import multiprocessing
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from beam_pipelines.graph.near_duplicate_search import DEFAULT_MAX_BUCKET_ENTRIES
from beam_pipelines.image import phash as image_hash
from beam_pipelines.image import prepare as images
from beam_pipelines.image.prepare import ImageOptions, prepare_image
from beam_pipelines.samples import scene_rgb
from catalog.near_duplicates import bucket_blocks, bucket_layout, bucket_values, find_pairs
from catalog.window_buckets import chunk_kinds, entry_hashes, find_window_pairs_by_buckets
from catalog.window_search import WindowRule, find_window_pairs

VARIANTS = (
    "jpeg_q50",
    "jpeg_q75",
    "resize_50",
    "crop_5",
    "crop_10",
    "brightness_+20",
    "brightness_x1.2",
    "flip",
)
THRESHOLDS = (6, 8, 10, 12)


def _jpeg(pixels: np.ndarray, quality: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def _crop(pixels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    height, width = pixels.shape[:2]
    cut_x, cut_y = round(width * fraction), round(height * fraction)
    left, top = int(rng.integers(0, cut_x + 1)), int(rng.integers(0, cut_y + 1))
    return pixels[top : top + height - cut_y, left : left + width - cut_x]


def variant(name: str, original: bytes, rng: np.random.Generator) -> bytes:
    """The bytes of one variant of an original JPEG."""
    pixels = np.asarray(Image.open(io.BytesIO(original)).convert("RGB"))
    if name == "jpeg_q50":
        return _jpeg(pixels, 50)
    if name == "jpeg_q75":
        return _jpeg(pixels, 75)
    if name == "resize_50":
        image = Image.fromarray(pixels)
        return _jpeg(np.asarray(image.resize((image.width // 2, image.height // 2))))
    if name == "crop_5":
        return _jpeg(np.ascontiguousarray(_crop(pixels, 0.05, rng)))
    if name == "crop_10":
        return _jpeg(np.ascontiguousarray(_crop(pixels, 0.10, rng)))
    if name == "brightness_+20":
        return _jpeg(np.clip(pixels.astype(np.int16) + 20, 0, 255).astype(np.uint8))
    if name == "brightness_x1.2":
        return _jpeg(np.clip(pixels.astype(np.float32) * 1.2, 0, 255).astype(np.uint8))
    if name == "flip":
        return _jpeg(np.ascontiguousarray(pixels[:, ::-1]))
    raise ValueError(f"unknown variant {name!r}; expected one of {VARIANTS}")


def quality_rows(n: int, seed: int = 0) -> list[dict]:
    """Recall and precision per variant and threshold over ``n`` scenes."""
    rng = np.random.default_rng(seed)
    options = ImageOptions()
    hashes: list[int] = []
    scene: list[int] = []
    kind: list[str] = []
    for i in range(n):
        original = _jpeg(scene_rgb((500, 375), seed=1_000_003 + i))
        for name in ("original", *VARIANTS):
            data = original if name == "original" else variant(name, original, rng)
            hashes.append(prepare_image(data, options).phash)
            scene.append(i)
            kind.append(name)
    h = np.array(hashes, dtype=np.uint64)
    scenes = np.array(scene)
    kinds = np.array(kind)
    rows = []
    for threshold in THRESHOLDS:
        pairs = find_pairs(h, threshold)
        same = scenes[pairs.first] == scenes[pairs.second]
        originals = (kinds[pairs.first] == "original") & (kinds[pairs.second] == "original")
        row = {"threshold": threshold, "distinct pairs": int((originals & ~same).sum())}
        for name in VARIANTS:
            with_original = (
                same
                & (
                    ((kinds[pairs.first] == name) & (kinds[pairs.second] == "original"))
                    | ((kinds[pairs.second] == name) & (kinds[pairs.first] == "original"))
                )
            ).sum()
            involved = (kinds[pairs.first] == name) | (kinds[pairs.second] == name)
            found = int(involved.sum())
            row[name] = (
                int(with_original) / n,
                (int((involved & same).sum()) / found) if found else 1.0,
            )
        rows.append(row)
    return rows


def _cpu(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def hash_cost(n: int, rounds: int = 5) -> tuple[float, float, float]:
    """CPU microseconds per image: ``prepare_image``, the luma sample taken inside it, and the
    hash of the samples computed all at once (as the pipeline does per staging file).

    The sample is timed where the pipeline takes it (inside ``prepare_image``, from the resized
    output: ``phash.output_sample``) by wrapping the call; medians over the rounds.
    """
    sources = [_jpeg(scene_rgb((500, 375), seed=s)) for s in range(n)]
    options = ImageOptions()
    real = images.output_sample
    spent = [0.0]

    def timed(image):
        start = time.process_time()
        try:
            return real(image)
        finally:
            spent[0] += time.process_time() - start

    prepared: list = []

    def prepare_all() -> None:
        prepared.clear()
        for data in sources:
            prepared.append(prepare_image(data, options).luma_sample)

    prepare_all()  # warm caches and imports
    whole, sampled, hashed = [], [], []
    images.output_sample = timed
    try:
        for _ in range(rounds):
            spent[0] = 0.0
            whole.append(_cpu(prepare_all))
            sampled.append(spent[0])
            hashed.append(_cpu(lambda: image_hash.window_hashes(prepared)))
    finally:
        images.output_sample = real
    per_image = [float(np.median(v)) / n * 1e6 for v in (whole, sampled, hashed)]
    return per_image[0], per_image[1], per_image[2]


def search_cost(n: int, windows: bool) -> tuple[float, int, float]:
    """CPU seconds of the gathered search over ``n`` examples of uniform random window
    hashes (the whole frames alone, or the window rule), the pairs found, and how much its
    search raised the peak RSS (MB), measured in a fresh process."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    worker = context.Process(target=_search_in_process, args=(n, windows, queue))
    worker.start()
    seconds, found, before, peak = queue.get()
    worker.join()
    return seconds, found, peak - before


def _search_in_process(n: int, windows: bool, queue) -> None:
    hashes = _uniform(n)
    before = _high_water_mb()
    start = time.process_time()
    pairs = find_window_pairs(hashes, WindowRule()) if windows else find_pairs(hashes[:, 0], 8)
    queue.put((time.process_time() - start, len(pairs), before, _high_water_mb()))


def _uniform(n: int) -> np.ndarray:
    """``(n, W)`` uniform random window hashes (the default rule's W)."""
    rng = np.random.default_rng(7)
    shape = (n, WindowRule().windows)
    return rng.integers(0, 2**64 - 1, shape, dtype=np.uint64, endpoint=True)


def _kind_values(hashes: np.ndarray, layout, chunk: int, kind: int) -> np.ndarray:
    """Every example's bucket value on ``chunk`` for entries of ``kind``."""
    column = entry_hashes(hashes, np.full(hashes.shape[0], kind, np.uint8))
    return bucket_values(column, layout, chunk).astype(np.int64)


def _largest_bucket(hashes: np.ndarray, rule: WindowRule):
    """``(chunk, rows, kinds)`` of the bucket with the most entries (a kind at a time: at
    10 M examples every entry at once would take gigabytes)."""
    best = (0, np.zeros(0, np.int64), np.zeros(0, np.uint8))
    layout = bucket_layout(rule.bucket_threshold)
    for chunk in range(len(layout)):
        kinds = chunk_kinds(rule, chunk).tolist()
        size = 1 << layout[chunk][1]
        counts = sum(
            np.bincount(_kind_values(hashes, layout, chunk, k), minlength=size) for k in kinds
        )
        top = int(np.argmax(counts))
        if counts[top] <= best[1].shape[0]:
            continue
        members = [np.flatnonzero(_kind_values(hashes, layout, chunk, k) == top) for k in kinds]
        kind = [np.full(m.shape[0], k, np.uint8) for k, m in zip(kinds, members, strict=True)]
        best = (chunk, np.concatenate(members), np.concatenate(kind))
    return best


def _worker_memory(chunk: int, search: tuple[np.ndarray, ...], queue) -> None:
    # A fresh process holding only its search's packs, as a worker does after the shuffle,
    # running the engine's step over them.
    from beam_pipelines.graph.near_duplicate_search import SearchBucketFn, entry_dtype

    hashes, keys, kinds, block, split = search
    rows = np.zeros(hashes.shape[0], entry_dtype(hashes.shape[1]))
    rows["key"], rows["hashes"] = keys, hashes.view(np.int64)
    rows["kind"], rows["block"] = kinds, block
    packs = [rows[i : i + 64].tobytes() for i in range(0, rows.shape[0], 64)]  # as shuffled
    del rows
    before = _high_water_mb()
    start = time.process_time()
    fn = SearchBucketFn(WindowRule())
    pairs = sum(1 for _ in fn.process(((chunk, 0, 0, 1 if split else 0), packs)))
    cpu = time.process_time() - start
    queue.put((int(hashes.shape[0]), before, _high_water_mb(), cpu, pairs))


def _high_water_mb() -> float:
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork and exec, so a spawned child
    # would report its parent's peak.
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status: the worker memory row needs Linux")


def bucket_cost(n: int, max_entries: int, compare: bool) -> dict:
    """The bucketed search over ``n`` examples of uniform window hashes under the default
    rule: with ``compare``, against ``find_window_pairs`` (equality, CPU seconds of both over
    every bucket); always, the largest bucket and the largest search (a bucket, or one block
    pair of a bucket over ``max_entries``) run by the engine's step in a fresh process: its
    peak RSS and CPU."""
    hashes, rule = _uniform(n), WindowRule()
    row: dict = {"pairs": None, "same": None, "exact_cpu": None, "bucket_cpu": None}
    if compare:
        start = time.process_time()
        exact = find_window_pairs(hashes, rule)
        row["exact_cpu"] = time.process_time() - start
        start = time.process_time()
        bucketed, _ = find_window_pairs_by_buckets(hashes, rule, max_bucket_entries=max_entries)
        row["bucket_cpu"] = time.process_time() - start
        row["pairs"] = len(exact)
        row["same"] = np.array_equal(exact.window, bucketed.window) and all(
            np.array_equal(getattr(exact.pairs, f), getattr(bucketed.pairs, f))
            for f in ("first", "second", "distance", "flipped")
        )
    chunk, rows, kinds = _largest_bucket(hashes, rule)
    row["largest"] = int(rows.shape[0])
    blocks = bucket_blocks(rows.shape[0], max_entries)
    block = rows % blocks
    picked = block <= 1  # block pair (0, 1) of a split bucket, or the whole bucket
    search = (hashes[rows[picked]], rows[picked], kinds[picked], block[picked], blocks > 1)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    worker = context.Process(target=_worker_memory, args=(chunk, search, queue))
    worker.start()
    entries, before, peak, cpu, _pairs = queue.get()
    worker.join()
    row.update(blocks=blocks, worker_entries=entries, rss_before=before, rss_peak=peak)
    row["worker_cpu"] = cpu
    return row


def chance_pairs(n: int, threshold: int, flips: bool = True) -> float:
    """Expected pairs among ``n`` independent uniform 64-bit hashes within ``threshold``."""
    within = sum(math.comb(64, k) for k in range(threshold + 1)) / 2.0**64
    return n * (n - 1) / 2 * within * (2 if flips else 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="distinct scenes (1000)")
    parser.add_argument("--cost_n", type=int, default=200, help="images for the hash cost (200)")
    parser.add_argument(
        "--search", default="100000,1000000", help="hash counts for the search rows"
    )
    parser.add_argument(
        "--buckets", default="1000000,3000000", help="hash counts for the bucketed search rows"
    )
    parser.add_argument(
        "--max_bucket_entries", type=int, default=DEFAULT_MAX_BUCKET_ENTRIES,
        help="split buckets past this many entries (the engine's default)",
    )  # fmt: skip
    parser.add_argument(
        "--compare_up_to", type=int, default=1_000_000,
        help="check the bucketed search against find_pairs at these sizes and below",
    )  # fmt: skip
    parser.add_argument("--skip_quality", action="store_true", help="only the search rows")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.cost_n, args.search, args.buckets = 30, 30, "20000", "20000"
    sizes = [int(s) for s in args.search.split(",") if s]
    if not args.skip_quality:
        _quality_and_cost(args)
    _search_rows(sizes)
    buckets = [int(s) for s in args.buckets.split(",") if s]
    _bucket_rows(buckets, args.max_bucket_entries, args.compare_up_to)
    return 0


def _bucket_rows(sizes: list[int], max_entries: int, compare_up_to: int) -> None:
    print(
        "\nbucketed search (the engine's; uniform window hashes, t=8, tw=7, buckets split past "
        f"{max_entries:,} entries; compared with find_window_pairs up to {compare_up_to:,}):"
    )
    print(
        "| examples | pairs | equal to gathered | gathered CPU s | buckets CPU s "
        "| largest bucket | blocks | largest search | its CPU s | worker RSS before / peak MB |"
    )
    print("|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        row = bucket_cost(n, max_entries, compare=n <= compare_up_to)

        def cell(value, fmt):
            return "–" if value is None else format(value, fmt)

        same = "–" if row["same"] is None else ("yes" if row["same"] else "NO")
        print(
            f"| {n:,} | {cell(row['pairs'], ',')} | {same} | {cell(row['exact_cpu'], '.1f')} | "
            f"{cell(row['bucket_cpu'], '.1f')} | {row['largest']:,} | {row['blocks']} | "
            f"{row['worker_entries']:,} | {row['worker_cpu']:.1f} | "
            f"{row['rss_before']:.0f} / {row['rss_peak']:.0f} |"
        )
        sys.stdout.flush()


def _quality_and_cost(args) -> None:

    print(f"near-duplicates of {args.n} distinct scenes, flips on (recall / precision):")
    rows = quality_rows(args.n)
    header = "| variant | " + " | ".join(f"t={r['threshold']}" for r in rows) + " |"
    print(header)
    print("|---|" + "---:|" * len(rows))
    for name in VARIANTS:
        cells = [f"{r[name][0]:.1%} / {r[name][1]:.1%}" for r in rows]
        print(f"| {name} | " + " | ".join(cells) + " |")
    pairs_total = args.n * (args.n - 1) // 2
    cells = [f"{r['distinct pairs']} of {pairs_total:,}" for r in rows]
    print("| distinct scenes paired | " + " | ".join(cells) + " |")

    print("\nhash cost (CPU per image, 500x375 JPEG sources, 256 px, medians of 5 rounds):")
    whole, sample, batch = hash_cost(args.cost_n)
    print(
        f"  prepare_image {whole:.0f} us (sample included); the luma sample in it {sample:.0f} us, "
        f"the hash of {args.cost_n} samples at once {batch:.1f} us each: "
        f"{(sample + batch) / whole:.1%} of prepare_image"
    )


def _search_rows(sizes: list[int]) -> None:
    print("\ngathered search (uniform random window hashes, flips on, t=8, windows tw=7):")
    print(
        "| examples | search | CPU s | pairs found | chance pairs, whole frames "
        "| peak RSS growth MB (B an example) |"
    )
    print("|---:|---|---:|---:|---:|---:|")
    for n in sizes:
        for windows in (False, True):
            seconds, found, growth = search_cost(n, windows)
            name = "window rule" if windows else "whole frames alone"
            print(
                f"| {n:,} | {name} | {seconds:.1f} | {found:,} | {chance_pairs(n, 8):,.0f} | "
                f"{growth:,.0f} ({growth * 2**20 / n:,.0f}) |"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
