"""The split rules (``beam_pipelines/graph/splits.py``): class quotas in a clean build, the
base's splits kept on a ``--base`` with new examples filling each class's gap, and ``--help``,
``docs/pipeline.md`` and a built dataset held to one statement of the rule.

The build-on-a-base end to end (no example moves, the gaps filled) is in
``tests/test_first_day.py``; here the transform runs on Beam's test runner with records made up
for each case, and the base's splits are read from a real build's catalogs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import shutil
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines import images_to_tfrecord
from beam_pipelines.builds.base_splits import (
    BaseCatalogFile,
    base_splits_spec,
    read_base_splits,
)
from beam_pipelines.builds.incremental import BaseDamagedError, BaseRefusedError, open_base
from beam_pipelines.command_line import parse_command_line
from beam_pipelines.elements import CatalogMeta, PreparedRecord
from beam_pipelines.graph import splits
from beam_pipelines.graph.splits import QUOTA_RULE, AssignSplits, class_quota, split_value
from beam_pipelines.output.shards import TRAIN, VALIDATION
from schemas.manifest import TOOL_VERSION
from tests.fixtures.images import make_image_tree

REPO = Path(__file__).resolve().parents[1]
SIZES = {"big": 35, "mid": 12, "few": 3}
FRACTION = 0.1
# The statements about a base that --help, the docs and the module all make.
KEEP = "examples already in the base keep their split"
FILL = "new examples fill each class's gap"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _quota(n: int, f: float) -> int:
    """``QUOTA_RULE`` evaluated as written: the help's own formula, not a copy of it."""
    expression = QUOTA_RULE.split("=", 1)[1]
    return eval(expression, {"__builtins__": {}, "min": min, "floor": math.floor, "f": f, "n": n})


@pytest.fixture(scope="module")
def stratified(tmp_path_factory) -> Path:
    """A clean ``--stratify_validation`` build at 10 % of classes of 35, 12 and 3 tiny images."""
    root = tmp_path_factory.mktemp("stratified")
    make_image_tree(root / "images", SIZES, size=(16, 16))
    output = root / "dataset"
    summary = images_to_tfrecord.run(
        ["--input", str(root / "images"), "--output", str(output), "--image_size", "16",
         "--num_shards", "1", "--validation_fraction", str(FRACTION), "--stratify_validation",
         "--progress", "off"]
    )  # fmt: skip
    assert summary.published, summary.describe()
    return output


def _splits_by_class(dataset: Path) -> dict[str, dict[str, list[float]]]:
    """``{class: {split: [split values]}}`` from the dataset's catalogs."""
    found: dict[str, dict[str, list[float]]] = {}
    for catalog in dataset.glob("catalog-*.parquet"):
        table = pq.read_table(catalog, columns=["key", "text", "split"]).to_pydict()
        for key, text, split in zip(table["key"], table["text"], table["split"], strict=True):
            found.setdefault(text, {TRAIN: [], VALIDATION: []})[split].append(split_value(key))
    return found


def test_help_docs_and_a_built_dataset_state_the_same_quota(stratified, capsys):
    with pytest.raises(SystemExit):
        parse_command_line(["--help"])
    help_text = _flat(capsys.readouterr().out)
    docs = (REPO / "docs" / "pipeline.md").read_text(encoding="utf-8")
    determinism = _flat(re.search(r"- \*\*Determinism\.\*\*(.*?)\n- \*\*", docs, re.S).group(1))
    for name, text in [
        ("--help", help_text),
        ("docs/pipeline.md Determinism", determinism),
        ("splits.py", _flat(splits.__doc__ or "")),
    ]:
        for statement in (QUOTA_RULE, KEEP, FILL):
            assert statement in text, f"{name} does not say {statement!r}"

    # What --help promises is what the dataset holds: each class its quota, by split value.
    manifest = json.loads((stratified / "dataset.json").read_text())
    assert manifest["options"]["split_rule"] == "class_quota"
    by_class = _splits_by_class(stratified)
    for name, n in SIZES.items():
        k = _quota(n, FRACTION)
        assert k == class_quota(n, FRACTION)
        held = by_class[name]
        assert (len(held[VALIDATION]), len(held[TRAIN])) == (k, n - k), name
        assert held[TRAIN], f"{name} keeps a training example"
        assert max(held[VALIDATION], default=-1.0) < min(held[TRAIN]), name
    assert _quota(35, FRACTION) == 4  # floor(3.5 + 0.5)
    assert manifest["splits"]["validation"]["class_counts"] == {"big": 4, "mid": 1, "few": 0}


def test_the_quota_keeps_a_training_example_and_rounds_half_up():
    assert [class_quota(n, 0.5) for n in (0, 1, 2, 3, 4)] == [0, 0, 1, 2, 2]
    assert class_quota(2, 0.9) == 1  # floor(2.3) = 2, but one stays in train
    assert class_quota(25, 0.1) == 3  # floor(2.5 + 0.5)
    with pytest.raises(ValueError, match="--validation_fraction"):
        class_quota(10, 1.0)


def _sha(i: int) -> str:
    return hashlib.sha256(f"content {i}".encode()).hexdigest()


def _record(i: int, label: int) -> PreparedRecord:
    return PreparedRecord(
        _sha(i), f"/d/{label}/{i:03d}.jpg", b"x", CatalogMeta(label, "c", 8, 8, "JPEG")
    )


def _by_value(ids: list[int]) -> list[int]:
    return sorted(ids, key=lambda i: split_value(_sha(i)))


@pytest.mark.slow
def test_on_a_base_nothing_moves_and_new_examples_fill_each_gap():
    f = 0.25
    # Class 0: 8 in the base, 4 of them in validation (over its quota of 3 at n = 10, as after
    # removals or a base placed by split value), and 2 new: they go to train.
    old0, new0 = list(range(0, 8)), [8, 9]
    # Class 1: 8 in the base's train, one relabelled from the base's validation, 4 new:
    # n = 13, quota 3, 1 kept, so the 2 new ones of the smallest split values fill the gap.
    old1, relabelled, new1 = list(range(100, 108)), 150, list(range(110, 114))
    # Class 2: 6 in the base's train and 1 new: quota 2, the one new example cannot fill it.
    old2, new2 = list(range(200, 206)), [206]
    base = {_sha(i): VALIDATION if i < 4 else TRAIN for i in old0}
    base |= {_sha(i): TRAIN for i in old1 + old2}
    base |= {_sha(relabelled): VALIDATION, _sha(999): VALIDATION}  # 999: no longer listed
    labels = {**dict.fromkeys(old0 + new0, 0), **dict.fromkeys(old1 + new1 + [relabelled], 1)}
    labels |= dict.fromkeys(old2 + new2, 2)
    records = [_record(i, label) for i, label in labels.items()]

    expected = {_sha(i): split for i in labels if (split := base.get(_sha(i)))}
    expected |= {_sha(i): TRAIN for i in new0}
    expected |= {_sha(i): VALIDATION if i in _by_value(new1)[:2] else TRAIN for i in new1}
    expected |= {_sha(206): VALIDATION}
    for order in (records, records[::-1]):
        with test_pipeline.TestPipeline() as p:
            base_splits = p | "Base" >> beam.Create(sorted(base.items()))
            placed = (
                p
                | "Records" >> beam.Create(order)
                | AssignSplits(f, stratify=True, base_splits=base_splits)
                | beam.MapTuple(lambda split, record: (record.sha256, split))
            )
            assert_that(placed, equal_to(sorted(expected.items())))


def test_a_base_sharing_nothing_gives_the_clean_quota():
    records = [_record(i, 0) for i in range(12)]
    validation = set(_by_value(list(range(12)))[:3])  # quota 3 of 12 at 25 %
    with test_pipeline.TestPipeline() as p:
        empty = p | "NoBase" >> beam.Create([("0" * 64, TRAIN)])  # a base sharing nothing
        placed = (
            p
            | "Records" >> beam.Create(records)
            | AssignSplits(0.25, stratify=True, base_splits=empty)
            | beam.MapTuple(lambda split, record: (record.sha256, split))
        )
        expected = [(_sha(i), VALIDATION if i in validation else TRAIN) for i in range(12)]
        assert_that(placed, equal_to(expected))


def test_a_base_listing_one_example_in_both_splits_fails_the_build():
    with pytest.raises(Exception, match="catalogs contradict each other"):
        with test_pipeline.TestPipeline() as p:
            base = p | "Base" >> beam.Create([(_sha(1), TRAIN), (_sha(1), VALIDATION)])
            _ = (
                p
                | "Records" >> beam.Create([_record(1, 0), _record(2, 0)])
                | AssignSplits(0.5, stratify=True, base_splits=base)
            )


def _open(dataset: Path):
    options = json.loads((dataset / "dataset.json").read_text())["options"]
    return open_base(str(dataset), options=options, tool_version=TOOL_VERSION)


def test_the_base_splits_are_read_from_its_catalogs(stratified):
    spec = base_splits_spec(_open(stratified), stratify=True, validation_fraction=0.2)
    assert spec is not None and {file.split for file in spec.files} == {TRAIN, VALIDATION}
    read = dict(pair for file in spec.files for pair in read_base_splits(file))
    listed = {}
    for catalog in stratified.glob("catalog-*.parquet"):
        table = pq.read_table(catalog, columns=["key", "split"]).to_pydict()
        listed.update(zip(table["key"], table["split"], strict=True))
    assert read == listed and len(read) == sum(SIZES.values())


def test_a_damaged_base_catalog_fails_naming_it(stratified, tmp_path):
    spec = base_splits_spec(_open(stratified), stratify=True, validation_fraction=0.1)
    file = next(f for f in spec.files if f.split == VALIDATION)
    copy = tmp_path / "base"
    shutil.copytree(stratified, copy)
    catalog = copy / file.info.file
    data = bytearray(catalog.read_bytes())
    data[len(data) // 2] ^= 0xFF
    catalog.write_bytes(bytes(data))
    with pytest.raises(BaseDamagedError, match=f"catalog {re.escape(str(catalog))} is damaged"):
        list(read_base_splits(BaseCatalogFile(str(copy), file.split, file.info)))


def test_a_zero_fraction_on_a_base_with_validation_examples_is_refused(stratified):
    with pytest.raises(BaseRefusedError, match=r"--validation_fraction 0 would move the 5 "):
        base_splits_spec(_open(stratified), stratify=True, validation_fraction=0.0)


def test_leaving_out_stratify_on_a_quota_base_warns_that_examples_move(stratified, caplog):
    with caplog.at_level(logging.WARNING, logger="beam_pipelines.builds.base_splits"):
        assert base_splits_spec(_open(stratified), stratify=False, validation_fraction=0.1) is None
    assert "add --stratify_validation to keep them" in caplog.text
