"""verify checks index files and catalogs against the shards, foreign globs, and keys."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest

from catalog.table import COLUMNS, SCHEMA, read_table, write_table
from dataset_tools.adopt import adopt
from dataset_tools.verify.__main__ import main
from dataset_tools.verify.verification import verify_dataset
from tests.fixtures.shards import to_inline_layout, write_foreign_shards

pytestmark = pytest.mark.slow


@pytest.fixture
def dataset(pipeline_dataset):
    return pipeline_dataset


@pytest.fixture()
def copy(dataset, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(dataset, target)
    return target


def _relist(root, name: str) -> None:
    """Lists a changed file's new size and hash, so only the content checks can catch it."""
    import hashlib

    to_inline_layout(root)  # entries edited as JSON
    data = json.loads((root / "dataset.json").read_text())
    digest = hashlib.sha256((root / name).read_bytes()).hexdigest()
    size = (root / name).stat().st_size
    for split in data["splits"].values():
        for shard in split["shards"]:
            if shard["index"]["file"] == name:
                shard["index"].update(num_bytes=size, sha256=digest)
        if split["catalog"]["file"] == name:
            split["catalog"].update(num_bytes=size, sha256=digest)
    (root / "dataset.json").write_text(json.dumps(data))


def _failures(report) -> list[str]:
    return [f"{s.file}: {p}" for s in report.shards for p in s.problems] + list(report.problems)


def test_a_sound_dataset_passes_with_its_index_files_and_catalogs(dataset):
    report = verify_dataset(dataset)
    assert report.ok, _failures(report)
    assert report.manifest_found


def test_missing_or_damaged_index_files_fail_naming_them(copy):
    (copy / "train-00001-of-00003.idx").unlink()
    idx = copy / "train-00002-of-00003.idx"
    idx.write_bytes(idx.read_bytes().replace(b"\n", b" \n", 1))
    failures = _failures(verify_dataset(copy))
    assert len(failures) == 2, failures
    assert "train-00001-of-00003.idx is missing" in failures[0]
    assert "train-00002-of-00003.idx is damaged" in failures[1]


def test_an_index_file_listed_as_it_is_but_wrong_fails_naming_the_line(copy):
    idx = copy / "train-00000-of-00003.idx"
    lines = idx.read_bytes().splitlines(keepends=True)
    offset, length = map(int, lines[1].split())
    lines[1] = f"{offset} {length - 4}\n".encode()
    lines[2] = f"{offset + length - 4} {int(lines[2].split()[1]) + 4}\n".encode()
    idx.write_bytes(b"".join(lines))
    _relist(copy, idx.name)
    failures = _failures(verify_dataset(copy))
    assert len(failures) == 2, failures  # lines 2 and 3 moved; both named
    assert failures[0].startswith(
        "train-00000-of-00003.tfrecord: index file train-00000-of-00003.idx: line 2 says "
        f"offset {offset} length {length - 4}, the record is at {offset} with length {length}"
    )


def test_missing_or_damaged_catalogs_fail_naming_them(copy):
    (copy / "catalog-validation.parquet").unlink()
    catalog = copy / "catalog-train.parquet"
    catalog.write_bytes(catalog.read_bytes()[:-8] + b"\0" * 8)
    failures = _failures(verify_dataset(copy))
    assert any("catalog-train.parquet is damaged" in f for f in failures), failures
    assert any("catalog-validation.parquet is missing" in f for f in failures), failures
    assert main([str(copy)]) == 1


@pytest.mark.parametrize(
    ("column", "change", "expected"),
    [
        ("key", lambda v: ["0" * 64] + v[1:], "key " + "0" * 64 + ", the record's key is"),
        ("offset", lambda v: [v[0] + 1] + v[1:], "offset 1 length"),
        ("index", lambda v: v[::-1], "index "),
        ("record", lambda v: [v[1], v[0]] + v[2:], "rows are in shard order"),
    ],
)
def test_catalog_rows_that_disagree_with_the_shards_fail(copy, column, change, expected):
    path = copy / "catalog-train.parquet"
    table = read_table(str(path))
    values = change(table.column(column).to_pylist())
    table = table.set_column(
        COLUMNS.index(column), SCHEMA.field(column), pa.array(values, SCHEMA.field(column).type)
    )
    write_table(table, str(path))
    _relist(copy, path.name)
    failures = _failures(verify_dataset(copy))
    assert failures and all(f.startswith("catalog catalog-train.parquet: row") for f in failures)
    assert expected in failures[0], failures


def test_a_glob_without_manifest_is_checked_and_says_so(tmp_path, capsys):
    foreign = write_foreign_shards(tmp_path / "shards", num_examples=9, num_shards=3)
    assert main([str(tmp_path / "shards" / "train-*")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no dataset.json found for")
    assert "OK   train-00002-of-00003  records=3\n" in out
    data = bytearray(foreign.paths[1].read_bytes())
    data[-3] ^= 1
    foreign.paths[1].write_bytes(bytes(data))
    assert main([str(tmp_path / "shards" / "train-*"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["manifest_found"] is False
    (bad,) = [s for s in report["shards"] if not s["ok"]]
    assert bad["file"] == foreign.paths[1].name and bad["num_records"] == 2
    assert "data CRC mismatch" in bad["problems"][0]


def test_adopted_shards_verify_with_their_index_files_and_catalog(tmp_path):
    write_foreign_shards(tmp_path / "shards", num_examples=9, num_shards=3)
    out = tmp_path / "adopted"
    adopt(str(tmp_path / "shards" / "train-*"), output=str(out), label_offset=1)
    assert verify_dataset(out).ok
    (out / "train-00000-of-00003.idx").write_bytes(b"")
    failures = _failures(verify_dataset(out))
    assert (
        failures == [failures[0]]
        and "index file train-00000-of-00003.idx is damaged" in failures[0]
    )


def test_keys_are_checked_by_byte_range(copy, capsys):
    keys = read_table(str(copy / "catalog-validation.parquet")).column("key").to_pylist()
    assert main([str(copy), "--key", keys[0], "--key", keys[-1]]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "OK: 2 keys checked by byte range"
    assert main([str(copy), "--key", "e" * 64]) == 1
    assert f"key {'e' * 64}: in no catalog" in capsys.readouterr().out
    shard = copy / "validation-00000-of-00001.tfrecord"
    data = bytearray(shard.read_bytes())
    data[20] ^= 1
    shard.write_bytes(bytes(data))
    assert main([str(copy), "--key", keys[0], "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert "data CRC mismatch" in report["problems"][0]
