"""The window rule's search: crops meet their originals, in ``find_window_pairs`` and in a build."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from beam_pipelines import images_to_tfrecord
from beam_pipelines.elements import CatalogMeta, PreparedRecord
from beam_pipelines.graph.near_duplicate_search import signed64, window_entry
from beam_pipelines.samples import scene_rgb
from catalog.near_duplicates import find_pairs
from catalog.phash import FLIP_MASK
from catalog.window_hashes import window_distance
from catalog.window_search import find_window_pairs


def _planted(n: int, seed: int = 0) -> np.ndarray:
    """``(n, 5)`` random window hashes; odd rows show a window of the row before (a crop),
    every fourth of them mirrored, a bit or two off."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**63, size=(n, 5), dtype=np.int64).view(np.uint64).copy()
    for i in range(0, n - 1, 2):
        crop = h[i, 1 + (i // 2) % 4] ^ np.uint64(0b101 << (i % 50))
        h[i + 1, 0] = crop ^ np.uint64(FLIP_MASK) if i % 8 == 0 else crop
    return h


def test_index_and_brute_force_agree_with_the_rule_pair_by_pair():
    h = _planted(1500)
    brute, brute_windows = find_window_pairs(h, 8, method="brute")
    index, index_windows = find_window_pairs(h, 8, method="index")
    for name in ("first", "second", "distance", "flipped"):
        assert np.array_equal(getattr(brute, name), getattr(index, name)), name
    assert np.array_equal(brute_windows, index_windows)
    expected = {
        (a, b) for a, b in itertools.combinations(range(200), 2) if window_distance(h[a], h[b]) <= 8
    }
    rows = list(zip(brute.first.tolist(), brute.second.tolist(), strict=True))
    found = {(a, b) for a, b in rows if b < 200}
    assert found == expected and len(expected) == 100
    for (a, b), d in zip(rows, brute.distance.tolist(), strict=True):
        assert d == window_distance(h[a], h[b])
    assert set(brute_windows.tolist()) == {1, 2, 3, 4}  # every planted pair is a crop
    assert brute.flipped.sum() == 750 // 4 + 1  # i % 8 == 0 among 0, 2, ..., 1498


def test_whole_frames_alone_are_find_pairs():
    h = _planted(600)
    h[:, 0] = h[::-1, 2]  # some whole frames now near each other by chance or not
    h[5, 0] = h[9, 0] ^ np.uint64(3)
    plain = find_pairs(h[:, 0], 8)
    for method in ("brute", "index"):
        pairs, windows = find_window_pairs(h[:, :1], 8, method=method)
        assert np.array_equal(pairs.first, plain.first)
        assert np.array_equal(pairs.second, plain.second)
        assert not windows.any()


def test_max_pairs_bounds_the_result():
    h = np.zeros((40, 5), np.uint64)  # blank images: every window equal
    pairs, windows = find_window_pairs(h, 8, max_pairs=100, method="index")
    assert len(pairs) == 100 and not pairs.complete
    assert not windows.any()  # whole frame to whole frame first, on a tie
    whole, _ = find_window_pairs(h, 8, method="brute")
    assert len(whole) == 40 * 39 // 2 and whole.complete


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match=r"\(N, W\)"):
        find_window_pairs(np.zeros(4, np.uint64))
    with pytest.raises(ValueError, match="method"):
        find_window_pairs(np.zeros((4, 5), np.uint64), method="fast")
    with pytest.raises(ValueError, match="threshold"):
        find_window_pairs(np.zeros((4, 5), np.uint64), 17)
    with pytest.raises(TypeError, match="uint64"):
        find_window_pairs(np.zeros((4, 5), np.float64))


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _crop(image: Image.Image, fraction: float) -> Image.Image:
    w, h = image.size
    dx, dy = round(w * fraction / 2), round(h * fraction / 2)
    return image.crop((dx, dy, w - dx, h - dy))


@pytest.fixture(scope="module")
def crop_build(tmp_path_factory) -> Path:
    """A build of an original and its 8 % crop (class ``a``: one lands in each split by the
    stratified class quota at 0.5) and two distinct scenes (class ``b``)."""
    root = tmp_path_factory.mktemp("crops")
    for name in ("a", "b"):
        (root / "images" / name).mkdir(parents=True)
    original = Image.fromarray(scene_rgb((400, 300), seed=3))
    (root / "images" / "a" / "original.png").write_bytes(_png(original))
    (root / "images" / "a" / "cropped.png").write_bytes(_png(_crop(original, 0.08)))
    for seed in (11, 12):
        scene = Image.fromarray(scene_rgb((400, 300), seed=seed))
        (root / "images" / "b" / f"scene_{seed}.png").write_bytes(_png(scene))
    argv = ["--input", str(root / "images"), "--output", str(root / "dataset")]
    argv += ["--validation_fraction", "0.5", "--stratify_validation", "--num_shards", "1"]
    assert images_to_tfrecord.main(argv) == 0
    return root / "dataset"


def test_a_planted_crop_in_validation_is_reported_as_leakage(crop_build):
    lines = (crop_build / "near_duplicates.jsonl").read_text(encoding="utf-8").splitlines()
    (pair,) = [json.loads(line) for line in lines]  # the distinct scenes give no pair
    names = {Path(pair["a"]["uri"]).name, Path(pair["b"]["uri"]).name}
    assert names == {"original.png", "cropped.png"}
    assert pair["leakage"] and {pair["a"]["split"], pair["b"]["split"]} == {
        "train",
        "validation",
    }
    assert pair["probably"] in ("crop 95%", "crop 90%"), pair["probably"]
    assert pair["distance"] <= 8
    manifest = json.loads((crop_build / "dataset.json").read_text(encoding="utf-8"))
    assert manifest["options"]["near_duplicate_windows"] == [1.0, 0.95, 0.9, 0.85, 0.8]
    # The window hashes serve the search only: the catalog keeps its columns.
    columns = pq.read_schema(crop_build / "catalog-train.parquet").names
    assert "windows" not in columns and "phash" in columns


def test_window_entry_carries_the_windows_or_the_whole_frame_in_their_place():
    meta = CatalogMeta(label=2, text="b", height=8, width=8, format="PNG", phash=2**63 + 5)
    record = PreparedRecord("ab" * 32, "x.png", b"", meta)
    entry = window_entry(("validation", record))
    assert entry is not None and entry[1:4] == (signed64(2**63 + 5), 1, 2)
    assert entry[4:] == (entry[1],) * 4  # reused from a base: whole frame only
    windowed = record._replace(meta=meta._replace(windows=(1, 2, 2**64 - 1, 4)))
    assert window_entry(("train", windowed))[4:] == (1, 2, -1, 4)
    assert window_entry(("test", windowed)) is None
