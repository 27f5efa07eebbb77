"""The build graph as Beam's in-process runner fuses it: no per-record collection held whole.

The in-process runner (FnApiRunner, the default) holds in memory, whole, every PCollection it
passes from one fused stage to another. A build streams its records only while the image
step, the split, the shard assignment and the near-duplicate search's first map run in one
stage: the image step waits for the class names (a side input), so it starts a stage of its
own after the listing's, and the shard assignment's own wait (for the shard plan, counted in
the listing's stage) is then already over. These tests build the graph the launcher builds,
ask the runner how it fuses it (``FnApiRunner.create_stages``, what ``run_pipeline`` does
first) and name every PCollection read from a buffer. The control is the graph an image step
with no side input gives (what ``benchmarks/bench_metadata_scale.py`` simulated before its
stand-in took the class names): there every ``(split, record)`` is held whole.

Within the stage, the shard assignment holds locations until it packs them, and one bundle of
the in-process runner is every record: the last tests check its bound
(``shards.MAX_HELD_LOCATIONS``) and that small packs write the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_pipelines import ImagesToShards, StageResults, config_from_options
from beam_pipelines.elements import StagedRecord
from beam_pipelines.graph import transforms
from beam_pipelines.images_to_tfrecord import run
from beam_pipelines.output import shards
from beam_pipelines.output.shards import TRAIN, VALIDATION, _AssignAndPackFn, assign_shard
from beam_pipelines.output.staging import unpack_locations
from benchmarks.bench_metadata_scale import (
    SimulatedPrepareImages,
    _Outputs,
    _SimulatedPrepareFn,
    simulated_meta,
    write_listing,
)
from tests.fixtures.images import make_image_tree

# Per-record steps: their outputs must stay inside the stage that makes them.
_PER_RECORD = ("ImagesToShards/PrepareImages/", "ImagesToShards/AssignSplit/")


def _buffered(argv: list[str]) -> set[str]:
    """The producers of every PCollection the in-process runner buffers between stages."""
    options = PipelineOptions(argv)
    config = config_from_options(options)
    pipeline = beam.Pipeline(options=options)
    results = pipeline | "ImagesToShards" >> ImagesToShards(config)
    _ = results | "StageResults" >> StageResults(config.output, "offline")
    proto = pipeline.to_runner_api()
    _, stages = FnApiRunner().create_stages(proto)
    producers = {
        pcollection: transform.unique_name
        for transform in proto.components.transforms.values()
        if not transform.subtransforms
        for pcollection in transform.outputs.values()
    }
    buffered = set()
    for stage in stages:
        for transform in stage.transforms:
            payload = transform.spec.payload
            if transform.spec.urn == "beam:runner:source:v1" and payload.startswith(
                b"materialize:"
            ):
                pcollection = payload.decode().split(":", 1)[1]
                buffered.add(producers.get(pcollection, pcollection))
    return buffered


def _per_record(buffered: set[str]) -> list[str]:
    return sorted(name for name in buffered if name.startswith(_PER_RECORD))


@pytest.fixture
def build_args(tmp_path: Path) -> list[str]:
    listing = tmp_path / "inputs.csv"
    write_listing(listing, 50)
    return ["--input", str(listing), "--output", str(tmp_path / "out"), "--progress", "off"]


class _NoWaitPrepare(SimulatedPrepareImages):
    """The control: the stand-in image step given the class names as a plain argument instead
    of a side input (what the benchmark ran before), so the runner fuses it into the listing's
    stage."""

    def expand(self, sources):
        names = tuple(f"class{i:04d}" for i in range(1000))
        fn = _SimulatedPrepareFn(self._staging, self._file_bytes, self.stand_in_bytes)
        records = sources | "Simulate" >> beam.ParDo(fn, names)
        rejected = sources.pipeline | "NoRejections" >> beam.Create([])
        return _Outputs(records=records, rejected=rejected)


@pytest.mark.parametrize(
    "extra", [[], ["--near_duplicate_search", "bucketed"], ["--stratify_validation"]]
)
def test_build_streams_its_records_between_steps(build_args, extra):
    buffered = _buffered([*build_args, *extra])
    assert _per_record(buffered) == []
    # The listing's batches are what crosses (about 12 bytes an input), read after the wait.
    assert any(name.startswith("ImagesToShards/ListSources/") for name in buffered)


@pytest.mark.slow
def test_simulated_image_step_fuses_as_the_real_one(build_args, monkeypatch):
    real = _buffered(build_args)
    monkeypatch.setattr(transforms, "PrepareImages", SimulatedPrepareImages)
    assert _per_record(_buffered(build_args)) == _per_record(real) == []


def test_an_image_step_that_does_not_wait_holds_every_record(build_args, monkeypatch):
    monkeypatch.setattr(transforms, "PrepareImages", _NoWaitPrepare)
    assert _per_record(_buffered(build_args)) == [
        "ImagesToShards/AssignSplit/BySplitValue",
    ]


def test_moving_leakage_to_train_holds_every_record(build_args):
    """Known and documented: with ``--leakage move_to_train`` every record waits for the
    search over all of them."""
    buffered = _buffered([*build_args, "--leakage", "move_to_train"])
    assert "ImagesToShards/AssignSplit/BySplitValue" in _per_record(buffered)


def test_a_stratified_split_holds_every_record(build_args):
    """Known and documented: with ``--stratify_validation`` (and a validation split) every
    record, grouped by content, waits for the class quotas."""
    buffered = _buffered([*build_args, "--validation_fraction", "0.2", "--stratify_validation"])
    assert _per_record(buffered) == ["ImagesToShards/AssignSplit/Content"]


def _staged(i: int) -> StagedRecord:
    sha256, meta = simulated_meta(i)
    return StagedRecord(sha256, f"class{meta.label:04d}/{i:010d}.jpg", "f-0", 64 * i, 64, meta)


@pytest.mark.parametrize("max_held", [5_000, 64, 1])
def test_shard_assignment_holds_at_most_max_held_locations(max_held):
    """The shard assignment's buffers (one bundle of the in-process runner is every record)
    stay under ``max_held`` however many shards there are, and every location comes out once,
    in its shard."""
    plan = {TRAIN: 300, VALIDATION: 7}
    records = [(TRAIN if i % 50 else VALIDATION, _staged(i)) for i in range(4_000)]
    fn = _AssignAndPackFn(max_held=max_held)
    fn.start_bundle()
    out, most_held = [], 0
    for element in records:
        out.extend(fn.process(element, plan))
        most_held = max(most_held, sum(len(b) for b in fn._buffers.values()))
    out.extend(packed.value for packed in fn.finish_bundle())
    assert most_held < max_held
    assert not fn._buffers
    unpacked = sorted((shard, r) for shard, data in out for r in unpack_locations(data))
    want = sorted(
        ((split, assign_shard(r.sha256, plan[split]), plan[split]), r) for split, r in records
    )
    assert unpacked == want
    # Bounded by the shards alone, 4,000 locations over 307 shards would all wait to the end.
    packs = len(out)
    assert packs == 307 if max_held == 5_000 else packs > 307


@pytest.mark.slow
def test_small_packs_write_the_same_dataset(tmp_path, monkeypatch):
    """A build whose shard assignment packs every few locations (the bound reached all the
    time) writes the same bytes as one that packs each shard's locations once."""
    root = tmp_path / "images"
    paths = make_image_tree(root, {"cat": 9, "dog": 8, "fox": 7})
    (root / "fox" / "copy.jpg").write_bytes(paths["cat"][0].read_bytes())

    def build(name: str) -> dict[str, bytes]:
        out = tmp_path / name
        flags = ["--validation_fraction", "0.25", "--num_shards", "3", "--progress", "off"]
        assert run(["--input", str(root), "--output", str(out), *flags]).published
        return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    whole = build("whole")
    monkeypatch.setattr(shards, "MAX_HELD_LOCATIONS", 2)
    small = build("small")
    assert sorted(small) == sorted(whole)
    assert [n for n in whole if small[n] != whole[n]] == []
