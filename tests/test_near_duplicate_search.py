"""The near-duplicate search on the engine (``SearchNearDuplicates``) against the gathered one.

Random hashes with planted near pairs (plain and mirrored), a crowd of identical hashes (blank
images) and label conflicts; at thresholds 0, 3 and the default; whole buckets and buckets
split into blocks; on the in-process runner and on Dask. The bucketed search must give the
gathered search's result exactly (``search_columns``: every hash in one place).
"""

from __future__ import annotations

import array

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines.config import PipelineConfig, resolve_search
from beam_pipelines.engines.runners import resolve_runner_aliases
from beam_pipelines.graph.leakage import AUTO_BUCKETED_FROM, search_columns
from beam_pipelines.graph.near_duplicate_search import (
    SearchNearDuplicates,
    pairs_result,
    signed64,
)
from catalog.near_duplicates import (
    DEFAULT_THRESHOLD,
    bucket_blocks,
    find_pairs,
    find_pairs_by_buckets,
    search_bucket,
)
from catalog.phash import FLIP_MASK


def _planted_hashes(n: int, seed: int) -> np.ndarray:
    """``n`` uint64 hashes: a tenth each of near copies (1-4 bits off), mirrored near copies
    and copies of one hash (blank images); the rest uniform."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64, n, dtype=np.uint64)
    tenth = n // 10
    base = h[:tenth]
    for start, mirror in ((tenth, 0), (2 * tenth, FLIP_MASK)):
        copies = base ^ np.uint64(mirror)
        for _ in range(rng.integers(0, 4)):
            copies ^= np.uint64(1) << rng.integers(0, 64, tenth).astype(np.uint64)
        h[start : start + tenth] = copies
    h[3 * tenth : 4 * tenth] = h[5 * tenth]  # a crowd of one hash
    return h


def _entries(n: int, seed: int) -> list[tuple[int, int, int, int]]:
    """``(key number, phash, split code, label)`` rows as ``FindNearDuplicates`` makes them,
    with a byte-identical copy and a label conflict."""
    rng = np.random.default_rng(seed + 1)
    hashes = _planted_hashes(n, seed)
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    rows = [
        (int(k), signed64(int(h)), int(rng.random() < 0.2), int(rng.integers(0, 3)))
        for k, h in zip(keys, hashes, strict=True)
    ]
    rows.append(rows[7])  # the same content twice: one example
    rows.append((rows[11][0], rows[11][1], rows[11][2], rows[11][3] + 1))  # two classes
    return rows


def _columns(rows) -> tuple[array.array, ...]:
    columns = (array.array("q"), array.array("q"), array.array("B"), array.array("q"))
    for row in rows:
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return columns


def _run(options: PipelineOptions, rows, threshold: int, move: bool, max_entries: int) -> None:
    expected = search_columns(_columns(rows), threshold, move)
    assert expected["a"], "the planted data must hold pairs"
    with beam.Pipeline(options=options) as pipeline:
        found = (
            pipeline
            | beam.Create(rows)
            | SearchNearDuplicates(threshold=threshold, move=move, max_bucket_entries=max_entries)
        )
        assert_that(found, equal_to([expected]))


@pytest.mark.parametrize(
    ("threshold", "max_entries", "move"),
    [(0, 1 << 16, False), (3, 40, True), (DEFAULT_THRESHOLD, 1 << 16, True), (8, 64, False)],
)
def test_bucketed_search_equals_the_gathered_one_in_process(threshold, max_entries, move):
    _run(PipelineOptions([]), _entries(400, seed=threshold), threshold, move, max_entries)


def test_packs_flushed_mid_bundle_and_split_into_slices_find_the_same_pairs(monkeypatch):
    # A bundle's entries are packed 37 examples at a time, and a split bucket's repeated
    # entries at most 50 rows a slice: many packs per bucket, the same result.
    from beam_pipelines.graph import near_duplicate_search

    monkeypatch.setattr(near_duplicate_search, "PACK_CONTENTS", 37)
    monkeypatch.setattr(near_duplicate_search, "_PACK_ROWS", 50)
    _run(PipelineOptions([]), _entries(400, seed=9), DEFAULT_THRESHOLD, True, 40)


def test_an_entry_packs_to_26_bytes_and_back():
    from beam_pipelines.graph.near_duplicate_search import ENTRY

    row = np.array([(-(2**63), 2**63 - 1, 1, 2**31 - 1, True, 479)], ENTRY)
    back = np.frombuffer(row.tobytes(), ENTRY)
    assert ENTRY.itemsize == 26 and back.tolist() == row.tolist()


@pytest.mark.slow
def test_bucketed_search_equals_the_gathered_one_on_dask(dask_cluster):
    options = PipelineOptions(resolve_runner_aliases(dask_cluster.runner_args()))
    _run(options, _entries(300, seed=5), DEFAULT_THRESHOLD, True, 48)


@pytest.mark.parametrize(
    ("threshold", "max_entries"),
    [(0, 1 << 16), (0, 50), (1, 50), (5, 1 << 16), (8, 1 << 16), (8, 50), (16, 1 << 16)],
)
def test_every_bucket_together_finds_exactly_the_pairs_of_find_pairs(threshold, max_entries):
    hashes = _planted_hashes(1500, seed=threshold)
    expected = find_pairs(hashes, threshold)
    got, largest = find_pairs_by_buckets(hashes, threshold, max_bucket_entries=max_entries)
    assert len(expected) > 150
    for field in ("first", "second", "distance", "flipped"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), field)
    assert got.flipped.any() and (got.distance == 0).any()
    if max_entries == 50:
        assert largest <= 2 * 50  # the crowd of 150 identical hashes was split into blocks


def test_a_bucket_keeps_its_first_pairs_in_key_order():
    hashes = np.full(60, 12345, np.uint64)  # 1,770 pairs of identical hashes
    keys = np.arange(60, dtype=np.int64)[::-1].copy()
    found = search_bucket(0, hashes, keys, np.zeros(60, bool), 4, max_pairs=100)
    pairs = list(zip(keys[found.row_a].tolist(), keys[found.row_b].tolist(), strict=True))
    assert pairs == [(a, b) for a in range(60) for b in range(a + 1, 60)][:100]


def test_pairs_result_says_incomplete_at_the_cap(monkeypatch):
    from beam_pipelines.graph import near_duplicate_search

    monkeypatch.setattr(near_duplicate_search, "MAX_REPORTED_PAIRS", 2)
    pairs = [(1, 2, 0, False, 0, 0, 1, 0), (1, 3, 1, True, 0, 0, 0, 1)]
    found = pairs_result(3, pairs, move=True)
    assert not found["complete"] and found["moved"] == [2]
    assert found["leakage"] == [False, False] and found["cross_class"] == [False, True]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="--near_duplicate_threshold"):
        SearchNearDuplicates(threshold=17)
    with pytest.raises(ValueError, match="max_bucket_entries"):
        SearchNearDuplicates(max_bucket_entries=1)
    with pytest.raises(ValueError, match="chunk must be in"):
        search_bucket(9, np.zeros(2, np.uint64), np.arange(2), np.zeros(2, bool), 8)
    assert bucket_blocks(10, 10) == 1 and bucket_blocks(11, 10) == 3


@pytest.mark.slow
def test_a_bucketed_build_writes_the_gathered_builds_dataset(sample_datasets, tmp_path) -> None:
    """``--near_duplicate_search bucketed`` on the sample set (a planted leakage pair moved to
    train, a cross-class pair) writes what the default gathered build wrote: the same shards
    and the same report; ``dataset.json`` differs only in the option it records."""
    import json

    from beam_pipelines import images_to_tfrecord

    gathered = sample_datasets.moved.path
    out = tmp_path / "bucketed"
    summary = images_to_tfrecord.run(
        [
            "--input", str(sample_datasets.images), "--output", str(out),
            "--validation_fraction", "0.2", "--max_bad_fraction", "0.2",
            "--leakage", "move_to_train", "--near_duplicate_search", "bucketed",
            # Buckets of more than 3 entries are searched in blocks.
            "--near_duplicate_bucket_entries", "3",
        ]
    )  # fmt: skip
    assert summary.published, summary.describe()
    assert summary.near_duplicates["moved_to_train"] >= 1
    names = sorted(p.name for p in gathered.iterdir() if p.is_file())
    assert names == sorted(p.name for p in out.iterdir() if p.is_file())
    for name in names:
        if name != "dataset.json":
            assert (out / name).read_bytes() == (gathered / name).read_bytes(), name
    old, new = (json.loads((d / "dataset.json").read_text()) for d in (gathered, out))
    assert old["options"].pop("near_duplicate_search") == "gathered"
    assert new["options"].pop("near_duplicate_search") == "bucketed"
    assert old == new


@pytest.mark.parametrize(
    "asked, listed, in_process, chosen",
    [
        ("auto", None, False, "gathered"),  # a directory: its size is not known
        ("auto", AUTO_BUCKETED_FROM - 1, False, "gathered"),
        ("auto", AUTO_BUCKETED_FROM, False, "bucketed"),
        ("auto", 50 * AUTO_BUCKETED_FROM, True, "gathered"),  # the in-process runner
        ("gathered", 50 * AUTO_BUCKETED_FROM, False, "gathered"),
        ("bucketed", None, True, "bucketed"),
    ],
)  # fmt: skip
def test_auto_searches_by_bucket_for_large_listings_on_distributed_runners(
    tmp_path, asked, listed, in_process, chosen
):
    config = PipelineConfig(
        input=str(tmp_path / "in.csv"), output=str(tmp_path / "out"), near_duplicate_search=asked
    )
    resolved = resolve_search(config, listed_inputs=listed, in_process=in_process)
    assert resolved.near_duplicate_search == chosen
    assert resolved.manifest_options()["near_duplicate_search"] == chosen
    assert config.manifest_options()["near_duplicate_search"] == (
        "bucketed" if asked == "bucketed" else "gathered"
    )


def test_the_launcher_chooses_from_the_listings_size_and_the_runner(tmp_path, monkeypatch, caplog):
    import dataclasses
    import logging

    from beam_pipelines import config as config_module
    from beam_pipelines import images_to_tfrecord

    listing = tmp_path / "in.csv"
    listing.write_text("".join(f"img{i}.jpg,cat\n" for i in range(5)))
    config = PipelineConfig(input=str(listing), output=str(tmp_path / "out"))
    dask = PipelineOptions(resolve_runner_aliases(["--runner", "DaskRunner"]))
    in_process = PipelineOptions([])
    monkeypatch.setattr(config_module, "AUTO_BUCKETED_FROM", 5)
    with caplog.at_level(logging.INFO, logger="beam_pipelines.images_to_tfrecord"):
        assert images_to_tfrecord._choose_search(config, dask).search_method == "bucketed"
    assert "near-duplicate search: bucketed" in caplog.text and "about 5 inputs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="beam_pipelines.images_to_tfrecord"):
        assert images_to_tfrecord._choose_search(config, in_process).search_method == "gathered"
        monkeypatch.setattr(config_module, "AUTO_BUCKETED_FROM", 6)
        assert images_to_tfrecord._choose_search(config, dask).search_method == "gathered"
        # A listing that cannot be read is left to the job, which names the problem.
        (tmp_path / "dir.csv").mkdir()
        unreadable = dataclasses.replace(config, input=str(tmp_path / "dir.csv"))
        assert images_to_tfrecord._choose_search(unreadable, dask).search_method == "gathered"
    assert caplog.text == ""  # the gathered search is not announced
