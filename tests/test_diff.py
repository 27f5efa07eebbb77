"""``dataset_tools.diff``: each kind of change, per split and class, the CLI, and buckets under faults.

The datasets here are manifests and catalogs alone (no shard files exist): diff must never need
the shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from catalog.table import build_table, catalog_filename, write_table
from dataset_tools.diff import diff_datasets, main, stored_image_bytes
from schemas import (
    MANIFEST_NAME,
    Counts,
    FileInfo,
    ImageRecord,
    ImageSpec,
    Manifest,
    ShardInfo,
    SplitInfo,
    serialize_record,
    shard_filename,
)
from schemas.lineage import LATEST_NAME, format_latest_pointer
from schemas.shard_table import encode_manifest
from tests.fixtures.fault_proxy import FaultPlan
from tests.fixtures.object_store import BucketEnv, Server, upload_tree


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    text: str
    split: str = "train"
    uri: str = ""
    image_len: int = 300
    height: int = 24
    width: int = 32
    format: str = "JPEG"


def _key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _frame_length(row: Row, label: int) -> int:
    record = ImageRecord(
        encoded=b"\x01" * row.image_len,
        format=row.format,
        height=row.height,
        width=row.width,
        channels=3,
        label=label,
        text=row.text,
        filename=row.uri or f"/src/{row.key[:8]}.jpg",
        sha256=row.key,
    )
    return len(serialize_record(record)) + 16


def write_catalog_dataset(
    root: Path,
    rows: Sequence[Row],
    *,
    label_names: Sequence[str] = ("cat", "dog", "fish"),
    image_size: int = 256,
) -> Path:
    """A dataset.json and one catalog per split, as the pipeline lists them; no shards."""
    root.mkdir(parents=True)
    splits = {}
    for split in sorted({r.split for r in rows} | {"train"}):
        chosen = sorted((r for r in rows if r.split == split), key=lambda r: r.key)
        shard = shard_filename(split, 0, 1)
        labels = [label_names.index(r.text) for r in chosen]
        lengths = [_frame_length(r, lab) for r, lab in zip(chosen, labels, strict=True)]
        table = build_table(
            {
                "key": [r.key for r in chosen],
                "uri": [r.uri or f"/src/{r.key[:8]}.jpg" for r in chosen],
                "label": labels,
                "text": [r.text for r in chosen],
                "split": [split] * len(chosen),
                "index": list(range(len(chosen))),
                "shard": [shard] * len(chosen),
                "record": list(range(len(chosen))),
                "offset": list(np.cumsum([0, *lengths])[:-1]),
                "length": lengths,
                "height": [r.height for r in chosen],
                "width": [r.width for r in chosen],
                "format": [r.format for r in chosen],
            }
        )
        path = root / catalog_filename(split)
        write_table(table, str(path))
        blob = path.read_bytes()
        splits[split] = SplitInfo(
            len(chosen),
            (ShardInfo(shard, len(chosen), sum(lengths), "0" * 64),),
            catalog=FileInfo(path.name, len(blob), hashlib.sha256(blob).hexdigest()),
        )
    manifest = Manifest(
        label_names=tuple(label_names),
        splits=splits,
        counts=Counts(input=len(rows), written=len(rows), rejected=0, duplicates=0),
        image=ImageSpec(encoding="jpeg", image_size=image_size, crop="none"),
        options={"image_size": image_size, "encoding": "jpeg", "crop": "none"},
    )
    text, tables = encode_manifest(manifest)
    for name, data in tables.items():
        (root / name).write_bytes(data)
    (root / MANIFEST_NAME).write_text(text)
    return root


BASE = [
    Row(_key("a"), "cat"),
    Row(_key("b"), "cat"),
    Row(_key("c"), "dog"),
    Row(_key("d"), "dog", split="validation"),
    Row(_key("e"), "fish"),
    Row(_key("f"), "fish"),
]


def _replace(rows: list[Row], key: str, **changes) -> list[Row]:
    return [dataclasses.replace(r, **changes) if r.key == key else r for r in rows]


def test_identical_versions_are_unchanged(tmp_path: Path) -> None:
    old = write_catalog_dataset(tmp_path / "old", BASE)
    new = write_catalog_dataset(tmp_path / "new", BASE)
    report = diff_datasets(old, new)
    assert not report.changed
    assert report.totals["unchanged"] == 6 and report.totals["changed"] == 0
    assert report.splits["train"]["unchanged"] == 5
    assert report.classes["dog"] == {**report.classes["dog"], "old": 2, "new": 2, "unchanged": 2}


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"text": "dog"}, "relabelled"),
        ({"split": "validation"}, "moved"),
        ({"uri": "/elsewhere/a.jpg"}, "renamed"),
        ({"image_len": 301}, "reencoded"),
        ({"image_len": 40000}, "reencoded"),  # a varint grows: still found exactly
        ({"height": 25}, "reencoded"),
        ({"format": "PNG"}, "reencoded"),
    ],
)
def test_each_kind_of_change_on_one_example(tmp_path: Path, change: dict, flag: str) -> None:
    key = _key("a")
    old = write_catalog_dataset(tmp_path / "old", BASE)
    new = write_catalog_dataset(tmp_path / "new", _replace(BASE, key, **change))
    report = diff_datasets(old, new)
    assert report.changed
    flags = {
        f: n
        for f, n in report.totals.items()
        if f in ("moved", "relabelled", "renamed", "reencoded", "renumbered") and n
    }
    assert flags == {flag: 1}
    assert report.totals["changed"] == 1 and report.totals["unchanged"] == 5
    assert [s["key"] for s in report.examples[flag]] == [key]
    assert [s["key"] for s in report.examples["changed"]] == [key]


def test_relabel_and_reencode_together_are_both_found(tmp_path: Path) -> None:
    """A relabel changes the frame length too; the image size is found apart from it."""
    key = _key("a")
    old = write_catalog_dataset(tmp_path / "old", BASE)
    relabelled = write_catalog_dataset(tmp_path / "r", _replace(BASE, key, text="fish"))
    both = write_catalog_dataset(tmp_path / "b", _replace(BASE, key, text="fish", image_len=280))
    assert diff_datasets(old, relabelled).totals["reencoded"] == 0
    totals = diff_datasets(old, both).totals
    assert (totals["relabelled"], totals["reencoded"], totals["changed"]) == (1, 1, 1)


def test_added_removed_moved_relabelled_per_split_and_class(tmp_path: Path) -> None:
    rows = [r for r in BASE if r.key != _key("b")]  # removed: a cat from train
    rows.append(Row(_key("g"), "dog", split="validation"))  # added
    rows.append(Row(_key("h"), "fish"))  # added
    rows = _replace(rows, _key("c"), split="validation")  # moved: a dog
    rows = _replace(rows, _key("e"), text="cat")  # relabelled: fish -> cat
    old = write_catalog_dataset(tmp_path / "old", BASE)
    new = write_catalog_dataset(tmp_path / "new", rows)
    report = diff_datasets(old, new, limit=1)
    t = report.totals
    assert (t["added"], t["removed"], t["changed"], t["unchanged"]) == (2, 1, 2, 3)
    assert (t["old"], t["new"]) == (6, 7)
    train, validation = report.splits["train"], report.splits["validation"]
    assert (train["old"], train["new"], train["removed"], train["added"]) == (5, 4, 1, 1)
    assert (train["moved_out"], train["moved_in"], train["relabelled"]) == (1, 0, 1)
    assert (validation["added"], validation["moved_in"], validation["new"]) == (1, 1, 3)
    assert report.classes["cat"]["removed"] == 1 and report.classes["cat"]["relabelled_in"] == 1
    assert report.classes["fish"]["relabelled_out"] == 1 and report.classes["fish"]["added"] == 1
    assert report.classes["dog"]["moved"] == 1
    assert report.moves == {"train -> validation": 1}
    assert report.relabels == {"fish -> cat": 1}
    assert len(report.examples["added"]) == 1  # --limit
    assert report.examples["added"][0]["key"] == min(_key("g"), _key("h"))
    assert report.examples["relabelled"][0]["text"] == ["fish", "cat"]


def test_a_new_class_renumbers_labels_and_image_options_are_compared(tmp_path: Path) -> None:
    old = write_catalog_dataset(tmp_path / "old", BASE)
    new = write_catalog_dataset(
        tmp_path / "new",
        [*BASE, Row(_key("z"), "ant")],
        label_names=("ant", "cat", "dog", "fish"),
        image_size=224,
    )
    report = diff_datasets(old, new)
    assert report.label_names == {"added": ["ant"], "removed": [], "renumbered": True}
    assert report.totals["renumbered"] == 6 and report.totals["relabelled"] == 0
    assert report.image_options_differ
    assert report.image_option_changes == "image_size 256 -> 224"


def test_stored_image_bytes_inverts_the_serialisation_exactly() -> None:
    rng = np.random.default_rng(0)
    sizes = [1, 2, 100, 127, 128, 129, 16000, 16383, 16384, 2_097_151, 2_097_152, 300_000]
    rows = []
    for n in sizes:
        text = "é" * int(rng.integers(1, 200))
        uri = "/x/" + "u" * int(rng.integers(1, 300))
        label, height, width = int(rng.integers(0, 100_000)), 127, 16384
        record = ImageRecord(
            encoded=b"\0" * n, format="PNG", height=height, width=width, channels=1,
            label=label, text=text, filename=uri, sha256=_key(str(n)),
        )  # fmt: skip
        length = len(serialize_record(record)) + 16
        rows.append((length, len(text.encode()), len(uri), label, height, width, n))
    a = np.array(rows)
    found = stored_image_bytes(
        a[:, 0], format_len=np.full(len(a), 3), text_len=a[:, 1], uri_len=a[:, 2],
        label=a[:, 3], height=a[:, 4], width=a[:, 5],
    )  # fmt: skip
    assert found.tolist() == sizes
    wrong = stored_image_bytes(
        np.array([5]), format_len=np.array([3]), text_len=np.array([1]), uri_len=np.array([1]),
        label=np.array([0]), height=np.array([1]), width=np.array([1]),
    )  # fmt: skip
    assert wrong.tolist() == [-1]


def test_cli_exit_status_json_and_fail_on_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write_catalog_dataset(tmp_path / "old", BASE)
    same = write_catalog_dataset(tmp_path / "same", BASE)
    new = write_catalog_dataset(tmp_path / "new", BASE[1:])
    assert main([str(old), str(same), "--fail_on_change"]) == 0
    assert "NO CHANGE" in capsys.readouterr().out
    assert main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "removed 1" in out and "CHANGED" in out
    assert main([str(old), str(new), "--fail_on_change"]) == 1
    capsys.readouterr()
    assert main([str(old), str(new), "--json", "--limit", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["totals"]["removed"] == 1 and data["changed"] is True
    assert data["examples"]["removed"] == []


def test_missing_or_damaged_catalog_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = write_catalog_dataset(tmp_path / "old", BASE)
    new = write_catalog_dataset(tmp_path / "new", BASE)
    (new / catalog_filename("validation")).unlink()
    assert main([str(old), str(new)]) == 2
    assert "catalog-validation.parquet does not exist" in capsys.readouterr().err
    (old / catalog_filename("train")).write_bytes(b"PAR1 not really")
    assert main([str(old), str(old)]) == 2
    assert "catalog-train.parquet: 15 bytes, dataset.json says" in capsys.readouterr().err
    shutil.copy(new / catalog_filename("train"), old / catalog_filename("train"))
    write_catalog_dataset(tmp_path / "other", BASE[1:])
    shutil.copy(tmp_path / "other" / catalog_filename("train"), old / catalog_filename("train"))
    assert main([str(old), str(old)]) == 2
    err = capsys.readouterr().err
    assert "catalog-train.parquet" in err and ("SHA-256" in err or "bytes" in err)


def test_latest_pointer_is_followed(tmp_path: Path) -> None:
    versions = tmp_path / "ds"
    write_catalog_dataset(versions / "v0001", BASE)
    write_catalog_dataset(versions / "v0002", BASE[1:])
    (versions / LATEST_NAME).write_text(format_latest_pointer("v0002"))
    report = diff_datasets(versions / "v0001", versions)
    assert report.new["root"].endswith("v0002") and report.totals["removed"] == 1


def test_module_runs_as_a_command(tmp_path: Path) -> None:
    old = write_catalog_dataset(tmp_path / "old", BASE)
    result = subprocess.run(
        [sys.executable, "-m", "dataset_tools.diff", str(old), str(old), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["changed"] is False


@pytest.mark.parametrize("scheme", ["s3", "gcs"])
def test_diff_on_a_bucket_through_faults_matches_local(
    scheme: str, request: pytest.FixtureRequest, fault_proxy: Callable, tmp_path: Path
) -> None:
    bucket: BucketEnv = request.getfixturevalue("s3_env" if scheme == "s3" else "gcs_env")
    server: Server = request.getfixturevalue("moto_server" if scheme == "s3" else "gcs_emulator")
    rows = _replace([r for r in BASE if r.key != _key("f")], _key("a"), text="dog")
    rows = [*rows, Row(_key("q"), "cat", split="validation")]
    old = write_catalog_dataset(tmp_path / "ds" / "v0001", BASE)
    new = write_catalog_dataset(tmp_path / "ds" / "v0002", rows)
    (tmp_path / "ds" / LATEST_NAME).write_text(format_latest_pointer("v0002"))
    upload_tree(tmp_path / "ds", bucket.uri("ds"))
    expected = diff_datasets(old, new).to_dict()

    plan = FaultPlan(seed=3, error_rate=0.2, reset_rate=0.1, truncate_rate=0.1, max_consecutive=2)
    proxy = request.getfixturevalue("fault_proxy")(
        server.url, plan, flavour="s3" if scheme == "s3" else "gcs"
    )
    bucket.point_at(proxy.url)
    found = diff_datasets(bucket.uri("ds", "v0001"), bucket.uri("ds")).to_dict()

    assert proxy.stats.faults >= 1, proxy.stats
    for name in ("totals", "splits", "classes", "moves", "relabels", "examples"):
        assert found[name] == expected[name]
    assert found["new"]["root"] == bucket.uri("ds", "v0002")
    assert found["new"]["manifest_sha256"] == expected["new"]["manifest_sha256"]


def test_keys_that_are_not_hex_digests_or_share_a_prefix_still_match() -> None:
    """The sort-based match falls back to a hash join; both give the same pairs."""
    import pyarrow as pa

    from dataset_tools.diff import full_join

    twin = "0" * 16
    cases = [
        (["b", "a", "c"], ["c", "d", "a"]),  # not hex digests
        ([twin + "1" * 48, twin + "2" * 48, "f" * 64], [twin + "2" * 48, "e" * 64]),
    ]
    for old_keys, new_keys in cases:
        old = pa.table({"key": old_keys, "split": ["train"] * len(old_keys)})
        new = pa.table({"key": new_keys, "split": ["train"] * len(new_keys)})
        joined = full_join(old, new)
        keys = [
            old_keys[o] if o is not None else new_keys[n]
            for o, n in zip(
                joined.column("row_old").to_pylist(),
                joined.column("row_new").to_pylist(),
                strict=True,
            )
        ]
        pairs = sorted(
            zip(
                keys,
                joined.column("split_old").to_pylist(),
                joined.column("split_new").to_pylist(),
                strict=True,
            )
        )
        expected = sorted(
            (k, "train" if k in old_keys else None, "train" if k in new_keys else None)
            for k in set(old_keys) | set(new_keys)
        )
        assert pairs == expected
