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


def test_local_one_level_listing_upload_and_digest(tmp_path: Path) -> None:
    store = storage_for(str(tmp_path))
    (tmp_path / "cat" / "deep").mkdir(parents=True)
    (tmp_path / "dog").mkdir()
    (tmp_path / "cat" / "deep" / "a.jpg").write_bytes(b"deep")
    (tmp_path / "top.csv").write_bytes(b"uri,label\n")
    (tmp_path / "link-to-dir").symlink_to(tmp_path / "dog")  # left out, as Beam leaves it
    (tmp_path / "link-to-file").symlink_to(tmp_path / "top.csv")

    dirs, files = store.list_one_level(str(tmp_path) + "/")

    assert dirs == [str(tmp_path / "cat"), str(tmp_path / "dog")]
    assert [(f.uri, f.size) for f in files] == [
        (str(tmp_path / "link-to-file"), 10),
        (str(tmp_path / "top.csv"), 10),
    ]
    assert files[1].mtime == (tmp_path / "top.csv").stat().st_mtime
    as_uri = store.list_one_level(f"file://{tmp_path}")
    assert as_uri[0] == [f"file://{tmp_path}/cat", f"file://{tmp_path}/dog"]
    with pytest.raises(FileNotFoundError, match="nowhere"):
        store.list_one_level(str(tmp_path / "nowhere"))

    source = tmp_path / "source.bin"
    source.write_bytes(b"0123456789" * 1000)
    target = str(tmp_path / "new" / "dir" / "copy.bin")
    store.upload(target, str(source))  # parents made; a temporary name, then renamed
    assert (tmp_path / "new" / "dir").is_dir()
    assert [p.name for p in (tmp_path / "new" / "dir").iterdir()] == ["copy.bin"]
    assert store.digest(target, chunk_bytes=333) == (
        10_000,
        hashlib.sha256(source.read_bytes()).hexdigest(),
    )
    with pytest.raises(FileNotFoundError, match="missing"):
        store.digest(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="absent"):
        store.upload(str(tmp_path / "x"), str(tmp_path / "absent"))
    assert not (tmp_path / "x").exists()
