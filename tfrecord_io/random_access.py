"""Random access by key: a dataset's catalogs say where each example is; only its bytes are read.

``read_examples(dataset, keys)`` looks the keys up in the split catalogs
(``catalog-<split>.parquet``, or its partitions in order, each checked against the size and
SHA-256 that ``dataset.json`` lists),
then reads each example's byte range from its shard through ``objstore.storage_for``: one
``pread`` on local files, one ranged GET on ``s3://`` and ``gs://``. Every frame's CRCs are
checked before its payload is returned.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from catalog.partitions import read_catalog_files
from objstore import storage_for
from schemas import Manifest
from schemas.framing import parse_frame
from schemas.manifest import FileInfo
from tfrecord_io import source as _source

__all__ = [
    "ExampleLocation",
    "KeyedExample",
    "DatasetFiles",
    "dataset_files",
    "read_range",
    "load_catalog",
    "locate",
    "read_examples",
]

_LOOKUP_COLUMNS = ["key", "split", "index", "shard", "record", "offset", "length"]


@dataclasses.dataclass(frozen=True)
class ExampleLocation:
    """Where an example is: its split and position in it (``index``, as the catalog's column),
    its shard, its position there, and its frame's bytes."""

    key: str
    split: str
    index: int
    shard: str
    record: int
    offset: int
    length: int


class KeyedExample(NamedTuple):
    """An example read by key: where it was and its serialised ``tf.train.Example``."""

    location: ExampleLocation
    serialized: bytes


class DatasetFiles(NamedTuple):
    """A published dataset's manifest and where its files are.

    Attributes:
      manifest: the parsed ``dataset.json``.
      root: the directory (or URI) holding ``dataset.json``, index files and catalogs.
      shard_root: the directory holding the shards (``root`` unless adopted elsewhere).
    """

    manifest: Manifest
    root: str
    shard_root: str

    def path(self, relative: str) -> str:
        return _source.join(self.root, relative)

    def shard_path(self, shard_file: str) -> str:
        return _source.join(self.shard_root, shard_file)


def dataset_files(dataset: str | os.PathLike[str]) -> DatasetFiles:
    """Resolves a dataset root (or its ``dataset.json``) to its manifest and directories.

    Raises:
      FileNotFoundError: if ``dataset`` holds no ``dataset.json``.
      ValueError: if the manifest is invalid.
    """
    text = os.fspath(dataset)
    path = _source.manifest_path(text)
    if path is None:
        raise FileNotFoundError(
            f"{text} has no dataset.json: random access needs a published dataset (or shards "
            "adopted with python -m dataset_tools.adopt)"
        )
    manifest = _source.load_manifest(path)
    assert manifest is not None
    root = posixpath.dirname(path) if _source.is_remote(path) else os.path.dirname(path)
    return DatasetFiles(manifest, root or ".", manifest.shard_root or root or ".")


def read_range(path: str, start: int, end: int) -> bytes:
    """Reads bytes ``[start, end)`` of a local file or URI, and nothing else.

    Raises:
      ValueError: if the file ends before ``end``, naming it.
      OSError: from storage (object-store errors name the URI).
    """
    return storage_for(path).read_range(path, start, end)


def load_catalog(
    dataset: str | os.PathLike[str] | DatasetFiles,
    split: str,
    *,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Reads a split's catalog after checking its size and SHA-256 against ``dataset.json``.

    Raises:
      KeyError: if the dataset has no such split.
      FileNotFoundError: if the manifest lists no catalog for the split, or the file is missing.
      ValueError: if the catalog's bytes differ from the manifest's, or it is not a catalog,
        naming the file.
    """
    files = dataset if isinstance(dataset, DatasetFiles) else dataset_files(dataset)
    listed = files.manifest.split(split).catalog_files
    if not listed:
        raise FileNotFoundError(
            f"dataset.json of {files.root} lists no catalog for split {split!r}: the dataset was "
            "written before catalogs existed; rewrite it, or adopt its shards with "
            "python -m dataset_tools.adopt"
        )

    def read(info: FileInfo) -> bytes:
        path = files.path(info.file)
        if not _source.exists(path):
            raise FileNotFoundError(f"catalog {path} is missing (dataset.json lists it)")
        return _source.read_bytes(path)

    # One file (or partition) is read and checked at a time; the rows are then joined.
    return read_catalog_files(
        listed, read, columns=columns, where=lambda info: files.path(info.file)
    )


def locate(
    dataset: str | os.PathLike[str] | DatasetFiles,
    keys: Iterable[str],
    *,
    splits: Sequence[str] | None = None,
) -> dict[str, ExampleLocation]:
    """Finds where examples are, by key, in the catalogs of ``splits`` (all by default).

    Returns:
      ``{key: location}`` for the keys found; keys in no catalog are left out.
    """
    files = dataset if isinstance(dataset, DatasetFiles) else dataset_files(dataset)
    wanted = pa.array(sorted(set(keys)), type=pa.string())
    found: dict[str, ExampleLocation] = {}
    for split in splits or sorted(files.manifest.splits):
        if not files.manifest.split(split).shards:
            continue
        table = load_catalog(files, split, columns=_LOOKUP_COLUMNS)
        hits = table.filter(pc.is_in(table.column("key"), value_set=wanted))
        for row in hits.to_pylist():
            found.setdefault(row["key"], ExampleLocation(**row))
    return found


def read_examples(
    dataset: str | os.PathLike[str],
    keys: Sequence[str],
    *,
    splits: Sequence[str] | None = None,
) -> list[KeyedExample]:
    """Returns the examples for ``keys``, in the order given, reading only their byte ranges.

    Args:
      dataset: a published (or adopted) dataset: its root or ``dataset.json``, local or URI.
      keys: example keys (hex SHA-256 of the source bytes, the catalog's ``key`` column).
      splits: the splits to look in (all by default).

    Raises:
      KeyError: naming the keys no catalog lists.
      FrameError (a ValueError): if a byte range is not an intact record, naming the shard.
      FileNotFoundError / ValueError: for a dataset without catalogs or with a damaged one.
    """
    files = dataset_files(dataset)
    locations = locate(files, keys, splits=splits)
    missing = [k for k in dict.fromkeys(keys) if k not in locations]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise KeyError(f"no example with key {shown} in the catalogs of {files.root}")
    payloads: dict[str, bytes] = {}
    # Shard by shard, in file order: neighbouring reads stay near each other.
    for key, where in sorted(locations.items(), key=lambda kv: (kv[1].shard, kv[1].offset)):
        path = files.shard_path(where.shard)
        data = read_range(path, where.offset, where.offset + where.length)
        payloads[key] = parse_frame(data, name=path, offset=where.offset)
    return [KeyedExample(locations[k], payloads[k]) for k in keys]
