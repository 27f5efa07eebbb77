"""The near-duplicate search on the engine (``SearchNearDuplicates``) against the gathered one.

Random window hashes with planted crops (a whole frame near a window of another example),
mirrored crops, whole-frame copies (plain and mirrored), a crowd of identical hashes (blank
images) and label conflicts; at thresholds 0, 3 and the default; whole buckets and buckets
split into blocks; on the in-process runner and on Dask. The bucketed search must give the
gathered search's result exactly (``search_columns``: every hash in one place).
"""

from __future__ import annotations

import array
import sys

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines.config import PipelineConfig, resolve_search
from beam_pipelines.engines.runners import resolve_runner_aliases
from beam_pipelines.graph.leakage import _COLUMN_TYPES, AUTO_BUCKETED_FROM, search_columns
from beam_pipelines.graph.near_duplicate_search import (
    SearchNearDuplicates,
    pairs_result,
    signed64,
)
from catalog.near_duplicates import (
    DEFAULT_THRESHOLD,
    bucket_blocks,
    find_pairs,
)
from catalog.phash import FLIP_MASK
from catalog.window_buckets import find_window_pairs_by_buckets
from catalog.window_search import WindowRule
from tests.test_window_search import planted_windows


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


def _entries(n: int, seed: int) -> list[tuple[int, ...]]:
    """``(key number, phash, split code, label, window 1, 2, 3)`` rows as
    ``FindNearDuplicates`` makes them (``planted_windows``: crops, mirrored crops, copies and
    a crowd), with a byte-identical copy and a label conflict."""
    rng = np.random.default_rng(seed + 1)
    hashes = planted_windows(n, seed)
    keys = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    rows = [
        (int(k), signed64(int(h[0])), int(rng.random() < 0.2), int(rng.integers(0, 3)),
         *(signed64(int(w)) for w in h[1:]))
        for k, h in zip(keys, hashes, strict=True)
    ]  # fmt: skip
    rows.append(rows[7])  # the same content twice: one example
    rows.append((*rows[11][:3], rows[11][3] + 1, *rows[11][4:]))  # two classes
    return rows


def _columns(rows) -> tuple[array.array, ...]:
    columns = tuple(array.array(code) for code in _COLUMN_TYPES)
    for row in rows:
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return columns


def _run(options: PipelineOptions, rows, threshold: int, move: bool, max_entries: int) -> None:
    rule = WindowRule(threshold, min(threshold, 7))
    expected = search_columns(_columns(rows), rule, move)
    assert expected["a"], "the planted data must hold pairs"
    if threshold:
        assert any(expected["window"]) and any(expected["flipped"]), "crops and mirrors"
    with beam.Pipeline(options=options) as pipeline:
        found = (
            pipeline
            | beam.Create(rows)
            | SearchNearDuplicates(rule=rule, move=move, max_bucket_entries=max_entries)
        )
        assert_that(found, equal_to([expected]))


@pytest.mark.parametrize(
    ("threshold", "max_entries", "move"),
    [
        pytest.param(0, 1 << 16, False, marks=pytest.mark.slow),
        (3, 40, True),
        (DEFAULT_THRESHOLD, 1 << 16, True),
        (8, 64, False),
    ],
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


def test_an_entry_packs_to_50_bytes_and_back():
    from beam_pipelines.graph.near_duplicate_search import entry_dtype

    entry = entry_dtype(4)
    row = np.array([(-(2**63), 1, 2**31 - 1, 4, 479, (2**63 - 1, -1, 0, 5))], entry)
    back = np.frombuffer(row.tobytes(), entry)
    assert entry.itemsize == 50 and back["hashes"].tolist() == [[2**63 - 1, -1, 0, 5]]
    assert [back[f].tolist() for f in ("key", "split", "label", "kind", "block")] == [
        [-(2**63)],
        [1],
        [2**31 - 1],
        [4],
        [479],
    ]


@pytest.mark.slow
def test_bucketed_search_equals_the_gathered_one_on_dask(dask_cluster):
    options = PipelineOptions(resolve_runner_aliases(dask_cluster.runner_args()))
    _run(options, _entries(300, seed=5), DEFAULT_THRESHOLD, True, 48)


@pytest.mark.parametrize(
    ("threshold", "max_entries"),
    [(0, 1 << 16), (0, 50), (1, 50), (5, 1 << 16), (8, 1 << 16), (8, 50), (16, 1 << 16)],
)
def test_every_bucket_together_finds_exactly_the_pairs_of_find_pairs(threshold, max_entries):
    # Whole frames alone (a rule without windows): the pairs of find_pairs.
    hashes = _planted_hashes(1500, seed=threshold)
    expected = find_pairs(hashes, threshold)
    rule = WindowRule(threshold, threshold, (1.0,))
    found, largest = find_window_pairs_by_buckets(
        hashes[:, None], rule, max_bucket_entries=max_entries
    )
    got = found.pairs
    assert len(expected) > 150 and not found.window.any()
    for field in ("first", "second", "distance", "flipped"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field), field)
    assert got.flipped.any() and (got.distance == 0).any()
    if max_entries == 50:
        assert largest <= 2 * 50  # the crowd of 150 identical hashes was split into blocks


def test_pairs_result_says_incomplete_at_the_cap(monkeypatch):
    from beam_pipelines.graph import near_duplicate_search

    monkeypatch.setattr(near_duplicate_search, "MAX_REPORTED_PAIRS", 2)
    pairs = [(1, 2, 0, False, 0, 0, 0, 1, 0), (1, 3, 1, True, 2, 0, 0, 0, 1)]
    found = pairs_result(3, pairs, move=True)
    assert not found["complete"] and found["moved"] == [2] and found["window"] == [0, 2]
    assert found["leakage"] == [False, False] and found["cross_class"] == [False, True]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="--near_duplicate_threshold"):
        WindowRule(threshold=17)
    with pytest.raises(ValueError, match="max_bucket_entries"):
        SearchNearDuplicates(max_bucket_entries=1)
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

    def choose(config, options):
        listed = images_to_tfrecord._listed_inputs(config, options)
        return images_to_tfrecord._choose_search(config, options, listed)

    with caplog.at_level(logging.INFO, logger="beam_pipelines.images_to_tfrecord"):
        assert choose(config, dask).search_method == "bucketed"
    assert "near-duplicate search: bucketed" in caplog.text and "about 5 inputs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="beam_pipelines.images_to_tfrecord"):
        assert choose(config, in_process).search_method == "gathered"
        monkeypatch.setattr(config_module, "AUTO_BUCKETED_FROM", 6)
        assert choose(config, dask).search_method == "gathered"
        # A listing that cannot be read is left to the job, which names the problem.
        (tmp_path / "dir.csv").mkdir()
        unreadable = dataclasses.replace(config, input=str(tmp_path / "dir.csv"))
        assert choose(unreadable, dask).search_method == "gathered"
    assert caplog.text == ""  # the gathered search is not announced


def test_each_search_step_gives_back_what_its_bundle_freed_when_the_bundle_ends(monkeypatch):
    # Trims are at most one a second while a step runs; at a bundle's end one is made whatever
    # the period, or what the last packs or buckets freed stays in the worker into the next
    # step (230 MB at 10 M images on Spark).
    from beam_pipelines.graph import near_duplicate_search

    forced: set[str] = set()

    def release(*, now=None, force=False):
        caller = sys._getframe(1).f_locals.get("self")  # the DoFn that asked
        if force:
            forced.add(type(caller).__name__)
        return True

    monkeypatch.setattr(near_duplicate_search, "release_freed_memory", release)
    _run(PipelineOptions([]), _entries(200, seed=5), DEFAULT_THRESHOLD, False, 1 << 16)
    assert forced == {"_CountBucketsFn", "_ToBlocksFn", "SearchBucketFn"}, forced


def test_a_bucket_search_holds_under_230_bytes_an_entry_at_its_peak(monkeypatch):
    # docs/scale.md sizes an SDK worker by what its largest bucket search holds: 198 bytes an
    # entry (the rows it keeps, their hashes and the index's positions), 254 before the sort of
    # one entry per content stopped copying every row and the positions shrank to 4 bytes.
    import tracemalloc

    from beam_pipelines.graph import near_duplicate_search
    from beam_pipelines.graph.near_duplicate_search import SearchBucketFn, entry_dtype
    from catalog.near_duplicates import bucket_layout

    rule, examples = WindowRule(), 10_000
    rng = np.random.default_rng(3)
    low, width = bucket_layout(rule.bucket_threshold)[1]
    whole = rng.integers(0, 2**64, examples, dtype=np.uint64)
    whole &= ~np.uint64(((1 << width) - 1) << low)  # every whole frame in bucket (1, 0)
    rows = np.zeros(4 * examples, entry_dtype(rule.windows))
    rows["key"] = np.repeat(rng.integers(-(2**63), 2**63 - 1, examples, dtype=np.int64), 4)
    rows["label"] = np.repeat(rng.integers(0, 1000, examples), 4)
    rows["kind"] = np.tile([0, 2, 3, 4], examples)  # windows as the whole frame: adopted data
    rows["hashes"] = np.repeat(whole, 4).view(np.int64)[:, None]
    rows = rows[rng.permutation(rows.shape[0])]
    packs = [rows[i : i + 1000].tobytes() for i in range(0, rows.shape[0], 1000)]
    monkeypatch.setattr(near_duplicate_search, "release_freed_memory", lambda **_: False)
    tracemalloc.start()
    try:
        found = list(SearchBucketFn(rule).process(((1, 0, 0, 0), packs)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert found == []  # uniform hashes: no pair among 10,000 examples
    assert peak / rows.shape[0] < 230, peak / rows.shape[0]
