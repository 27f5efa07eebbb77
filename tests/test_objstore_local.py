"""``objstore.storage_for``: local paths behind the object stores' operations (``LocalStore``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from objstore import GCSStore, LocalStore, S3Store, storage_for


def test_each_scheme_gets_its_store(tmp_path: Path) -> None:
    assert isinstance(storage_for(str(tmp_path)), LocalStore)
    assert isinstance(storage_for(f"file://{tmp_path}"), LocalStore)
    assert isinstance(storage_for("s3://bucket/key"), S3Store)
    assert isinstance(storage_for("gs://bucket/key"), GCSStore)
    with pytest.raises(ValueError, match=r"unsupported storage scheme 'hdfs'.*s3://, gs://"):
        storage_for("hdfs://namenode/data")


def test_local_read_write_stat_list_and_glob(tmp_path: Path) -> None:
    store = storage_for(str(tmp_path))
    path = str(tmp_path / "a" / "b.bin")
    store.write_bytes(path, b"0123456789")  # parents made, written under a temporary name
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.bin"]
    assert store.size(path) == 10 and store.exists(path) and not store.isdir(path)
    assert store.isdir(str(tmp_path / "a")) and store.exists(str(tmp_path / "a"))
    assert store.read_bytes(f"file://{path}") == b"0123456789"
    assert store.read_range(path, 2, 5) == b"234"
    store.write_bytes(str(tmp_path / "a" / "c.bin"), b"x")
    assert [(i.uri, i.size) for i in store.list(str(tmp_path / "a") + "/")] == [
        (path, 10),
        (str(tmp_path / "a" / "c.bin"), 1),
    ]
    assert store.glob(str(tmp_path / "*" / "*.bin")) == [path, str(tmp_path / "a" / "c.bin")]
    assert store.glob(str(tmp_path / "*")) == []  # directories are not matched
    dest = str(tmp_path / "copy")
    assert store.download(path, dest) == hashlib.sha256(b"0123456789").hexdigest()
    store.delete(path)
    store.delete(path)  # a missing file is not an error
    assert not store.exists(path)


def test_local_errors_name_the_path_and_are_not_retried(tmp_path: Path) -> None:
    store = storage_for(str(tmp_path))
    missing = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="missing"):
        store.size(missing)
    with pytest.raises(FileNotFoundError, match="missing"):
        store.read_bytes(missing)
    (tmp_path / "short").write_bytes(b"abc")
    with pytest.raises(ValueError, match=r"short: bytes \[1, 9\) asked, but the file ends at 3"):
        store.read_range(str(tmp_path / "short"), 1, 9)
    with pytest.raises(ValueError, match="0 <= start < end"):
        store.read_range(str(tmp_path / "short"), 2, 2)
    with pytest.raises(ValueError, match="not 5"):
        store.download(str(tmp_path / "short"), str(tmp_path / "dest"), expected_size=5)
