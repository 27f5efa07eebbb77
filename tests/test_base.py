"""``beam_pipelines.builds.incremental``: reusing a published dataset's examples, and refusing a bad base."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from beam_pipelines import images_to_tfrecord
from beam_pipelines.builds.incremental import BaseDamagedError, BaseRefusedError, open_base
from beam_pipelines.image.phash import FEATURES
from catalog.index_files import parse_index
from schemas import MANIFEST_NAME, TOOL_VERSION, Manifest, record_from_example, serialize_record
from schemas.lineage import LATEST_NAME, format_latest_pointer
from tests.fixtures.images import make_image_tree

FLAGS = ["--num_shards", "2", "--image_size", "24", "--validation_fraction", "0.25"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A published base: 14 images in 3 classes, two train shards and a validation one."""
    root = tmp_path_factory.mktemp("base")
    make_image_tree(root / "images", {"cat": 5, "dog": 5, "fish": 4}, size=(40, 32))
    (root / "images" / "fish" / "copy.jpg").write_bytes(
        (root / "images" / "fish" / "fish_0000.jpg").read_bytes()
    )  # a duplicate: reused like any other image
    summary = images_to_tfrecord.run(
        ["--input", str(root / "images"), "--output", str(root / "v0001"), *FLAGS]
    )
    assert summary.published
    shutil.copy(root / "v0001" / MANIFEST_NAME, root / "reference.json")
    return root / "v0001"


def _copy(built: Path, tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copy(built.parent / "reference.json", tmp_path / "reference.json")
    return Path(shutil.copytree(built, tmp_path / "v0001"))


def _options(root: Path, **changes) -> dict:
    manifest = Manifest.from_json((root.parent / "reference.json").read_text())
    return {**manifest.options, **changes}


def _catalog_rows(root: Path) -> list[dict]:
    rows = []
    for split in ("train", "validation"):
        rows += pq.read_table(root / f"catalog-{split}.parquet").to_pylist()
    return rows


def _frame_payload(root: Path, row: dict) -> bytes:
    data = (root / row["shard"]).read_bytes()
    return data[row["offset"] + 12 : row["offset"] + row["length"] - 4]


def test_every_base_example_is_reused_byte_for_byte(built: Path) -> None:
    base = open_base(str(built), options=_options(built), tool_version=TOOL_VERSION)
    assert base.reusable and base.reason == "" and base.index.num_examples == 14
    for row in _catalog_rows(built):
        reused = base.reuse(
            row["key"], uri=row["uri"], label=row["label"], text=row["text"],
            source_bytes=row["source_bytes"],
        )  # fmt: skip
        assert reused is not None and not reused.rewritten
        assert reused.serialized == _frame_payload(built, row)
        meta = reused.meta._asdict()
        assert len(meta["window_phash"]) == 3  # the base's window hashes, no decode
        meta["window_phash"] = list(meta["window_phash"])  # a list in the catalog's row
        assert meta == {name: row[name] for name in meta}
    assert (
        base.reuse("0" * 64, uri="x", label=0, text="cat", source_bytes=1) is None
    )  # not in the base


def test_locate_points_into_the_base_only_when_named_the_same(built: Path) -> None:
    base = open_base(str(built), options=_options(built), tool_version=TOOL_VERSION)
    for row in _catalog_rows(built):
        names = {"uri": row["uri"], "label": row["label"], "text": row["text"]}
        found = base.locate(row["key"], **names, source_bytes=row["source_bytes"])
        assert (found.file, found.offset, found.length) == (
            str(built / row["shard"]), row["offset"], row["length"],
        )  # fmt: skip
        assert found.meta == base.reuse(row["key"], **names, source_bytes=row["source_bytes"]).meta
        for change in ({"uri": "/x.jpg"}, {"label": 9}, {"text": "zebra"}):
            assert base.locate(row["key"], **{**names, **change}, source_bytes=1) is None
    assert base.locate("f" * 64, uri="u", label=0, text="cat", source_bytes=1) is None


def test_a_relabel_rewrites_only_label_text_and_filename(built: Path) -> None:
    base = open_base(str(built), options=_options(built), tool_version=TOOL_VERSION)
    row = _catalog_rows(built)[0]
    reused = base.reuse(
        row["key"], uri="/new/place.jpg", label=7, text="zebra", source_bytes=row["source_bytes"]
    )
    assert reused.rewritten
    old = record_from_example(_frame_payload(built, row))
    new = record_from_example(reused.serialized)
    assert (new.label, new.text, new.filename) == (7, "zebra", "/new/place.jpg")
    assert (new.encoded, new.sha256, new.height, new.width) == (
        old.encoded, old.sha256, old.height, old.width,
    )  # fmt: skip
    assert reused.serialized == serialize_record(new)
    assert (reused.meta.label, reused.meta.text) == (7, "zebra")


def test_different_image_options_turn_reuse_off_and_say_why(
    built: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        base = open_base(
            str(built), options=_options(built, image_size=20), tool_version=TOOL_VERSION
        )
    expected = "image options differ from the base (image_size 24 -> 20): no examples reused"
    assert base.reason == expected and not base.reusable
    assert expected in caplog.text
    row = _catalog_rows(built)[0]
    assert base.reuse(row["key"], uri="u", label=0, text="cat", source_bytes=1) is None
    other_tool = open_base(str(built), options=_options(built), tool_version="9.9.9")
    assert "tool_version" in other_tool.reason
    # Options that only place examples never matter.
    moved = _options(built, num_shards=7, validation_fraction=0.5, input="/elsewhere")
    assert open_base(str(built), options=moved, tool_version=TOOL_VERSION).reusable
    # Nor do the near-duplicate options: they report pairs and may move one to train.
    near = {"leakage": "move_to_train", "near_duplicate_threshold": 4}
    placed = _options(built, **near, near_duplicate_search="bucketed")
    assert open_base(str(built), options=placed, tool_version=TOOL_VERSION).reusable


def test_versions_root_resolves_through_latest(built: Path, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    _copy(built, root)
    (root / LATEST_NAME).write_text(format_latest_pointer("v0001"))
    base = open_base(str(root), options=_options(built), tool_version=TOOL_VERSION)
    assert base.root == str(root / "v0001") and base.reusable


def test_a_plain_build_moved_into_a_versions_root_is_its_first_version(
    built: Path, tmp_path: Path
) -> None:
    """What the README says of a plain build: moved to ``DST/v0001`` (nothing in it names its
    own directory) it verifies, and ``--base DST`` reuses all of it."""
    from beam_pipelines import versions
    from dataset_tools.verify import verify_dataset

    root = tmp_path / "photos"
    root.mkdir()
    plain = Path(shutil.copytree(built, tmp_path / "out" / "photos"))
    plain.rename(root / "v0001")  # mv out/photos photos/v0001
    assert versions.main([str(root), "--set_latest", "v0001"]) == 0
    report = verify_dataset(str(root))
    assert report.ok and report.num_records == 14, report.problems
    base = open_base(str(root), options=_options(built), tool_version=TOOL_VERSION)
    assert base.root == str(root / "v0001") and base.index.num_examples == 14


def _refusal(root: Path) -> str:
    with pytest.raises(BaseRefusedError) as info:
        open_base(str(root), options=_options(root), tool_version=TOOL_VERSION)
    return str(info.value)


@pytest.fixture()
def damaged(built: Path, tmp_path: Path) -> Path:
    return _copy(built, tmp_path)


def test_an_unpublished_base_is_refused(damaged: Path) -> None:
    (damaged / MANIFEST_NAME).unlink()
    assert "dataset.json does not exist: the base is not published" in _refusal(damaged)


def test_a_base_being_written_is_refused(damaged: Path) -> None:
    (damaged / ".staging" / "done").mkdir(parents=True)
    (damaged / ".staging" / "plan.json").write_text("{}")
    assert ".staging exists: a build is writing into the base" in _refusal(damaged)


def test_a_truncated_or_missing_shard_is_refused(damaged: Path) -> None:
    shard = damaged / "train-00001-of-00002.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-10])
    message = _refusal(damaged)
    assert "train-00001-of-00002.tfrecord is" in message and "dataset.json says" in message
    shard.unlink()
    assert "train-00001-of-00002.tfrecord is missing" in _refusal(damaged)


def test_a_changed_catalog_is_refused(damaged: Path) -> None:
    catalog = damaged / "catalog-train.parquet"
    catalog.write_bytes(catalog.read_bytes() + b"\0")
    assert "catalog-train.parquet" in _refusal(damaged) and "differs from" in _refusal(damaged)
    catalog.unlink()
    assert "catalog-train.parquet is missing" in _refusal(damaged)


def test_a_base_without_catalogs_is_refused(damaged: Path) -> None:
    data = json.loads((damaged / MANIFEST_NAME).read_text())
    for split in data["splits"].values():
        split.pop("catalog", None)
    (damaged / MANIFEST_NAME).write_text(json.dumps(data))
    assert "lists no catalog for split" in _refusal(damaged)


def test_a_damaged_record_fails_the_reuse_naming_it(damaged: Path) -> None:
    base = open_base(str(damaged), options=_options(damaged), tool_version=TOOL_VERSION)
    row = _catalog_rows(damaged)[3]
    shard = damaged / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"] + row["length"] // 2] ^= 0x40  # same size: only the CRC can tell
    shard.write_bytes(bytes(data))
    entries = parse_index((damaged / row["shard"].replace(".tfrecord", ".idx")).read_bytes())
    assert (row["offset"], row["length"]) in [tuple(e) for e in entries.tolist()]
    with pytest.raises(BaseDamagedError, match=f"{row['shard']} record at byte {row['offset']}"):
        base.reuse(row["key"], uri=row["uri"], label=row["label"], text=row["text"],
                   source_bytes=1)  # fmt: skip


# --- incremental builds against clean builds ---------------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes]:
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    manifest = json.loads(files.pop(MANIFEST_NAME))
    lineage = manifest.pop("lineage", None)
    files[MANIFEST_NAME] = json.dumps(manifest, sort_keys=True).encode()
    return {"files": files, "lineage": lineage}


def _change(images: Path, change: str) -> None:
    if change == "add":  # two new images, one in a new class: every label index moves
        new = make_image_tree(images.parent / "new", {"ant": 1, "cat": 1}, size=(40, 32), seed=7)
        (images / "ant").mkdir()
        new["ant"][0].rename(images / "ant" / "ant_new.jpg")
        new["cat"][0].rename(images / "cat" / "cat_new.jpg")
    elif change == "remove":
        for path in sorted(images.rglob("*.jpg"))[:3]:
            path.unlink()
    elif change == "relabel":  # same bytes, another class (and so another file name)
        for path in sorted((images / "cat").iterdir())[:2]:
            path.rename(images / "dog" / path.name)


@pytest.mark.parametrize(
    ("change", "extra", "reused"),
    [
        ("add", [], 15),
        # The fast loop (-m "not slow") builds one change; the whole suite all four.
        pytest.param("remove", [], 12, marks=pytest.mark.slow),
        pytest.param("relabel", [], 15, marks=pytest.mark.slow),
        pytest.param("options", ["--image_size", "20"], 0, marks=pytest.mark.slow),
    ],
)
def test_incremental_build_equals_a_clean_build(
    built: Path, tmp_path: Path, change: str, extra: list[str], reused: int
) -> None:
    images = tmp_path / "images"
    shutil.copytree(built.parent / "images", images)
    _change(images, change)
    flags = [*FLAGS, *extra]
    clean = images_to_tfrecord.run(
        ["--input", str(images), "--output", str(tmp_path / "clean"), *flags]
    )
    incremental = images_to_tfrecord.run(
        ["--input", str(images), "--output", str(tmp_path / "inc"), *flags, "--base", str(built)]
    )
    assert clean.published and incremental.published
    a, b = _snapshot(tmp_path / "clean"), _snapshot(tmp_path / "inc")
    assert a["lineage"] is None
    assert sorted(a["files"]) == sorted(b["files"])
    for name in a["files"]:
        assert a["files"][name] == b["files"][name], name
    written = clean.manifest.counts.written + clean.manifest.counts.duplicates
    digest = hashlib.sha256((built / MANIFEST_NAME).read_bytes()).hexdigest()
    assert b["lineage"] == {
        "base_manifest_sha256": digest, "reused": reused, "prepared": written - reused,
    }  # fmt: skip
    assert incremental.metrics.get("images_reused", 0) == reused
    # diff, on real catalogs, sees the change and no re-encoding unless the options changed.
    from dataset_tools.diff import diff_datasets

    totals = diff_datasets(built, tmp_path / "inc").totals
    expected = {
        "add": {"added": 2, "renumbered": 14},
        "remove": {"removed": 3},
        "relabel": {"relabelled": 2},
        "options": {"reencoded": 14},
    }[change]
    assert {k: totals[k] for k in expected} == expected
    quiet = {"added", "removed", "relabelled", "renumbered", "reencoded", "moved"}
    assert all(totals[k] == 0 for k in quiet - set(expected)), str(totals)
    # The input was copied to another directory: every file name changed.
    assert totals["renamed"] == totals["old"] - totals["removed"]
    assert (built / MANIFEST_NAME).read_text() == (built.parent / "reference.json").read_text()


def test_the_command_refuses_an_unpublished_base(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _copy(built, tmp_path / "b")
    (base / MANIFEST_NAME).unlink()
    status = images_to_tfrecord.main(
        ["--input", str(built.parent / "images"), "--output", str(tmp_path / "out"), *FLAGS,
         "--base", str(base)]
    )  # fmt: skip
    assert status == 2
    assert "is refused" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# A whole build on a base in an S3 bucket (moto): end to end, so in the whole suite only.
@pytest.mark.slow
def test_a_base_on_a_bucket(built: Path, tmp_path: Path, s3_env) -> None:
    from tests.fixtures.object_store import upload_tree

    upload_tree(built, s3_env.uri("v0001"))
    images = tmp_path / "images"
    shutil.copytree(built.parent / "images", images)
    _change(images, "relabel")
    clean = tmp_path / "clean"
    images_to_tfrecord.run(["--input", str(images), "--output", str(clean), *FLAGS])
    summary = images_to_tfrecord.run(
        ["--input", str(images), "--output", str(tmp_path / "inc"), *FLAGS,
         "--base", s3_env.uri("v0001")]
    )  # fmt: skip
    assert summary.metrics["images_reused"] == 15
    assert _snapshot(clean)["files"] == _snapshot(tmp_path / "inc")["files"]


def test_a_base_record_damaged_in_place_fails_the_build_naming_it(
    built: Path, tmp_path: Path
) -> None:
    base = _copy(built, tmp_path / "b")
    row = _catalog_rows(base)[2]
    shard = base / row["shard"]
    data = bytearray(shard.read_bytes())
    data[row["offset"] + row["length"] // 2] ^= 0x01  # same size: open_base cannot tell
    shard.write_bytes(bytes(data))
    with pytest.raises(images_to_tfrecord.JobFailedError, match=f"{row['shard']} at byte"):
        images_to_tfrecord.run(
            ["--input", str(built.parent / "images"), "--output", str(tmp_path / "out"),
             *FLAGS, "--base", str(base)]
        )  # fmt: skip
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_a_base_that_resolves_to_the_output_is_refused_before_anything_changes(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    _copy(built, root)
    (root / LATEST_NAME).write_text(format_latest_pointer("v0001"))
    before = (root / "v0001" / MANIFEST_NAME).read_bytes()
    status = images_to_tfrecord.main(
        ["--input", str(built.parent / "images"), "--output", str(root / "v0001"), *FLAGS,
         "--overwrite", "--base", str(root)]
    )  # fmt: skip
    assert status == 2
    assert "the base is never modified" in capsys.readouterr().err
    assert (root / "v0001" / MANIFEST_NAME).read_bytes() == before


def test_a_base_whose_hashes_were_taken_otherwise_is_not_reused(built: Path) -> None:
    # A base built before the near-duplicate features came from the stored pixels has no
    # near_duplicate_features option: its catalog's hashes are of another kind, so mixing its
    # examples into a new catalog would hide pairs between old and new examples.
    current = _options(built)
    assert current["near_duplicate_features"] == FEATURES
    older = {k: v for k, v in current.items() if k != "near_duplicate_features"}
    manifest = json.loads((built / MANIFEST_NAME).read_text())
    assert manifest["options"]["near_duplicate_features"] == FEATURES
    base = open_base(str(built), options={**older, "near_duplicate_features": "source-96"},
                     tool_version=TOOL_VERSION)  # fmt: skip
    assert not base.reusable
    assert f"near_duplicate_features {FEATURES} -> source-96" in base.reason
    # A base built before the window hashes (no near_duplicate_windows, catalog v1) is not
    # reused either: its examples would have no window hashes to pair crops by.
    assert current["near_duplicate_windows"] == [1.0, 0.95, 0.9, 0.85]
    before = {k: v for k, v in current.items() if k != "near_duplicate_windows"}
    base = open_base(str(built), options=before, tool_version=TOOL_VERSION)
    assert not base.reusable
    assert "near_duplicate_windows [1.0, 0.95, 0.9, 0.85] -> None" in base.reason
