"""Resolves a dataset source to a manifest, readable shard paths, sizes and label names.

This is the one place where a ``source`` argument becomes files TensorFlow can open. A source is
either a dataset root (or its ``dataset.json``) written by the pipeline, or a glob of TFRecord
files in TensorFlow's ImageNet key convention with no manifest ("foreign" shards). Every
read, stat, listing and glob of a local path, ``s3://`` or ``gs://`` goes through
``objstore.storage_for``, one store per scheme with one retry policy. Shards that TensorFlow
cannot open itself (``s3://``, and ``gs://`` when ``STORAGE_EMULATOR_HOST`` is set) are streamed
through the bounded local shard cache (``tfrecord_io.cache``); the others are paths handed to
``tf.data`` as they are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import posixpath
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, cast, overload

from objstore import ObjectStore, get_store, has_glob, is_object_store_uri, storage_for
from objstore import local_path as _plain_path
from schemas import MANIFEST_NAME, Manifest, ShardInfo, TableShards
from schemas.lineage import LATEST_NAME, parse_latest_pointer

if TYPE_CHECKING:
    import tensorflow as tf

    from schemas.shard_table import ShardTable
    from tfrecord_io.cache import CacheConfig, ShardCache

__all__ = [
    "ResolvedSource",
    "ShardFile",
    "ShardFiles",
    "exists",
    "file_size",
    "is_remote",
    "join",
    "local_copy",
    "local_path",
    "load_manifest",
    "manifest_path",
    "read_manifest_file",
    "label_names",
    "num_classes",
    "object_store_for",
    "open_binary",
    "read_bytes",
    "reads_natively",
    "resolve_source",
]


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """One shard file to read.

    Attributes:
      path: a path or URI that ``tf.data.TFRecordDataset`` can open.
      num_bytes: the committed size from ``dataset.json``, or the size found on storage for
        foreign shards. The reader checks that it read exactly this many bytes.
      num_examples: the committed record count, or -1 when unknown (foreign shards).
      sha256: the committed SHA-256, or None when unknown (foreign shards).
    """

    path: str
    num_bytes: int
    num_examples: int = -1
    sha256: str | None = None


class ShardFiles(Sequence[ShardFile]):
    """A split's shard files from its manifest entries, built only for the rows asked for.

    A split of a few hundred thousand shards in a shard table (format version 2) costs an
    input pipeline only its share: ``files[i::n]`` reads the table's path, size, count and hash
    columns and builds ``ShardFile`` for those rows alone.
    """

    def __init__(self, root: str, entries: Sequence[ShardInfo]) -> None:
        self._root = root
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, index: int) -> ShardFile: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[ShardFile, ...]: ...

    def __getitem__(self, index: int | slice) -> ShardFile | tuple[ShardFile, ...]:
        if isinstance(index, slice):
            return self._rows(range(len(self))[index])
        return self._rows([range(len(self))[index]])[0]

    def _rows(self, rows: Sequence[int]) -> tuple[ShardFile, ...]:
        table = self._entries
        if isinstance(table, TableShards):
            from schemas.shard_table import ShardTable  # pyarrow only for shard tables

            if isinstance(table, ShardTable):
                return self._table_rows(table, rows)
        # Inline entries (already objects), or a table never given (whose read names it).
        return tuple(self._file(table[i]) for i in rows)

    def _table_rows(self, table: ShardTable, rows: Sequence[int]) -> tuple[ShardFile, ...]:
        # Four columns of the table, and Python objects for ``rows`` alone.
        columns = table.columns(["file", "num_bytes", "num_examples", "sha256"], rows).to_pydict()
        return tuple(
            ShardFile(join(self._root, file), size, count, digest.hex())
            for file, size, count, digest in zip(
                columns["file"],
                columns["num_bytes"],
                columns["num_examples"],
                columns["sha256"],
                strict=True,
            )
        )

    def __iter__(self) -> Iterator[ShardFile]:
        return iter(self[:])

    @property
    def root(self) -> str:
        """The directory or prefix the manifest's ``file`` names are relative to."""
        return self._root

    def rows(self, rows: Sequence[int]) -> tuple[ShardFile, ...]:
        """The shard files of ``rows`` (manifest positions), in that order."""
        return self._rows([int(i) for i in rows])

    def column(self, name: str) -> Any:
        """One manifest field of every shard, without a ``ShardFile`` per shard: ``num_examples``
        or ``num_bytes`` as an int64 numpy array; ``file`` (relative to ``root``) as the shard
        table's Arrow column (a ``pyarrow.ChunkedArray``, no Python object per shard), or a
        list of str for inline entries.

        Raises:
          ValueError: if ``name`` is none of those three; as ``ShardTable.column`` if the
            split's shard table is missing or damaged.
        """
        import numpy as np

        if name not in ("file", "num_examples", "num_bytes"):
            raise ValueError(f"column must be file, num_examples or num_bytes, got {name!r}")
        table = self._entries
        if isinstance(table, TableShards):
            from schemas.shard_table import ShardTable

            if isinstance(table, ShardTable):
                column = table.column(name)
                return column if name == "file" else column.to_numpy()
        values = [getattr(s, name) for s in table]
        return values if name == "file" else np.array(values, dtype=np.int64)

    def _file(self, s: ShardInfo) -> ShardFile:
        return ShardFile(join(self._root, s.file), s.num_bytes, s.num_examples, s.sha256)


@dataclasses.dataclass(frozen=True)
class ResolvedSource:
    """What a source resolves to for one split.

    Attributes:
      source: the source as given.
      split: the split resolved (for a foreign glob, the name given by the caller).
      manifest: the parsed ``dataset.json``, or None for foreign shards.
      shard_files: the split's shard files, in committed order (sorted by name for a glob);
        ``ShardFiles`` builds only the rows asked for (an input pipeline's share).
      label_names: class names indexed by label, or None when no manifest names them.
      streamed: True when the shards live where TensorFlow cannot open them, so that they are
        read through the shard cache (``prepare_files`` / ``open_records``).
      cache_config: the shard cache to use; None for the default (``open_default_cache``).
    """

    source: str
    split: str
    manifest: Manifest | None
    shard_files: Sequence[ShardFile]
    label_names: tuple[str, ...] | None
    streamed: bool = False
    cache_config: CacheConfig | None = None

    @functools.cached_property
    def shards(self) -> tuple[ShardFile, ...]:
        """Every shard file of the split (built once; a pipeline's share: ``shard_files``)."""
        return tuple(self.shard_files)

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.shards]

    @property
    def num_examples(self) -> int | None:
        """Examples in the split, or None when unknown (foreign shards)."""
        if self.manifest is None:
            return None
        return self.manifest.split(self.split).num_examples

    def shard_cache(self) -> ShardCache | None:
        """The process's shard cache for these shards (None when they are read directly).

        Raises:
          ValueError: if the cache is smaller than the largest shard.
        """
        if not self.streamed:
            return None
        from tfrecord_io.cache import RemoteShard, open_cache, open_default_cache

        shards = [RemoteShard(s.path, s.num_bytes, s.sha256) for s in self.shards]
        if self.cache_config is None:
            return open_default_cache(self.source, shards)
        return open_cache(self.cache_config, shards)

    def prepare_files(self, files: tf.data.Dataset, path_index: int | None = None) -> Any:
        """Puts download-ahead on a dataset of shard paths (unchanged when read directly).

        Apply it after the file order is fixed (shuffle, repeat) and before the interleave.
        """
        cache = self.shard_cache()
        return files if cache is None else cache.read_ahead(files, path_index)

    def open_records(
        self,
        path: tf.Tensor,
        buffer_size: int | None = None,
        *,
        skip_failed: bool = False,
        skip: tf.Tensor | None = None,
    ) -> Any:
        """``tf.data.TFRecordDataset`` of one shard path, through the shard cache if streamed.

        With ``skip_failed``, a streamed shard that cannot be downloaded or verified reads as
        empty (logged by the cache) rather than failing. ``skip`` records are skipped inside the
        file reader (headers read, bytes neither copied nor checksummed).
        """
        cache = self.shard_cache()
        if cache is None:
            import tensorflow as tf

            records = tf.data.TFRecordDataset(path, buffer_size=buffer_size)
            return records if skip is None else records.skip(skip)
        return cache.records(path, buffer_size, skip_failed=skip_failed, skip=skip)


def is_remote(path: str) -> bool:
    """True for URIs with a scheme (``gs://…``, ``s3://…``), False for local paths."""
    return "://" in path and not path.startswith("file://")


def reads_natively(path: str) -> bool:
    """True if TensorFlow should open ``path`` itself rather than through the shard cache.

    Local paths and ``file://`` are read directly. ``gs://`` is read by TensorFlow's own GCS
    filesystem, except when ``STORAGE_EMULATOR_HOST`` is set (TensorFlow ignores it and would go
    to Google). TensorFlow 2.21 has no ``s3://`` filesystem, so S3 always goes through the cache.
    """
    scheme = path.partition("://")[0] if "://" in path else ""
    if scheme == "s3":
        return False
    if scheme == "gs":
        return not os.environ.get("STORAGE_EMULATOR_HOST")
    return True


def object_store_for(path: str) -> ObjectStore | None:
    """The object store that serves ``path``, for the URIs TensorFlow cannot open itself
    (``s3://``, and ``gs://`` under ``STORAGE_EMULATOR_HOST``); None for anything else (local
    paths and the URIs ``tf.data`` opens itself). It says how ``tf.data`` reads a shard; every
    other read goes through ``objstore.storage_for``.
    """
    if is_object_store_uri(path) and not reads_natively(path):
        return get_store(path)
    return None


def local_path(path: str) -> str:
    """The plain filesystem path of a local path or ``file://`` URI (given as is otherwise)."""
    return _plain_path(path)


def join(root: str, relative: str) -> str:
    """Joins a dataset root and a manifest-relative path (``/``-separated) for local or URI roots."""
    if is_remote(root):
        return posixpath.join(root.rstrip("/") + "/", relative)
    return os.path.join(local_path(root), *relative.split("/"))


def read_bytes(path: str) -> bytes:
    """Reads a whole (small) file such as ``dataset.json``."""
    return storage_for(path).read_bytes(path)


def exists(path: str) -> bool:
    """True if a file or directory exists at a local path or URI."""
    store = storage_for(path)
    return store.exists(path) or store.isdir(path)


def open_binary(path: str) -> BinaryIO:
    """Opens a local path or URI for reading bytes (a context manager).

    An object-store URI is first downloaded to an anonymous temporary file.
    """
    store = storage_for(path)
    if not isinstance(store, ObjectStore):
        return open(local_path(path), "rb")
    local = tempfile.NamedTemporaryFile(prefix="tfrecord_io-")  # returned
    try:
        store.download(path, local.name)
    except BaseException:
        local.close()
        raise
    local.seek(0)
    return cast(BinaryIO, local)  # a NamedTemporaryFile wraps a binary file


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A path TensorFlow can open for ``path``: itself, or a temporary download of an
    object-store URI that is deleted afterwards (for one-pass reads such as verification)."""
    store = object_store_for(path)
    if store is None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="tfrecord_io-") as tmp:
        local = os.path.join(tmp, posixpath.basename(path) or "object")
        store.download(path, local)
        yield local


def _isdir(path: str) -> bool:
    return storage_for(path).isdir(path)


def file_size(path: str) -> int:
    """Size in bytes of the file at a local path or URI."""
    return storage_for(path).size(path)


def _glob(pattern: str) -> list[str]:
    return storage_for(pattern).glob(pattern)


def _follow_latest(pointer: str) -> str:
    """The version directory a ``latest`` pointer file names (a sibling of the pointer)."""
    parent = (
        posixpath.dirname(pointer) if is_remote(pointer) else os.path.dirname(local_path(pointer))
    )
    version = parse_latest_pointer(read_bytes(pointer), name=pointer)
    target = join(parent, version)
    if not exists(join(target, MANIFEST_NAME)):
        raise FileNotFoundError(
            f"{pointer} names version {version!r}, but {join(target, MANIFEST_NAME)} does not "
            "exist: the version was removed or never published; rewrite the pointer with "
            "python -m beam_pipelines.versions"
        )
    return target


def _manifest_path(source: str) -> str | None:
    """The ``dataset.json`` a source points at, or None if it is not a dataset root.

    A ``latest`` pointer (``DST/latest``, or ``DST`` holding one and no ``dataset.json``) is
    followed to the version it names.
    """
    if has_glob(source):
        return None
    stripped = source.rstrip("/")
    if posixpath.basename(stripped) == MANIFEST_NAME:
        return stripped
    if posixpath.basename(stripped) == LATEST_NAME and not _isdir(stripped) and exists(stripped):
        return join(_follow_latest(stripped), MANIFEST_NAME)
    if _isdir(stripped):
        candidate = join(stripped, MANIFEST_NAME)
        if exists(candidate):
            return candidate
        pointer = join(stripped, LATEST_NAME)
        if exists(pointer) and not _isdir(pointer):
            return join(_follow_latest(pointer), MANIFEST_NAME)
    return None


def manifest_path(source: str | os.PathLike[str]) -> str | None:
    """The ``dataset.json`` a dataset source resolves to (following a ``latest`` pointer), or
    None when the source is a glob or file of foreign shards.

    Raises:
      FileNotFoundError: if a ``latest`` pointer names a version that has no ``dataset.json``.
      ValueError: if a ``latest`` pointer is malformed.
    """
    return _manifest_path(_as_str(source))


def _as_str(source: str | os.PathLike[str]) -> str:
    if isinstance(source, os.PathLike):
        return os.fspath(source)
    if not isinstance(source, str) or not source:
        raise TypeError(
            f"source must be a dataset directory, a dataset.json path, or a glob of TFRecord "
            f"files, got {source!r}"
        )
    return source


def load_manifest(source: str | os.PathLike[str]) -> Manifest | None:
    """Loads the ``dataset.json`` of a dataset source.

    Args:
      source: a dataset root, its ``dataset.json``, or a glob of foreign shards.

    Returns:
      The manifest, or None when the source is a glob or a file of foreign shards.

    Raises:
      ValueError: if ``dataset.json`` exists but is not a valid manifest (naming the file).
    """
    path = _manifest_path(_as_str(source))
    if path is None:
        return None
    return read_manifest_file(path)


def read_manifest_file(path: str, data: bytes | None = None) -> Manifest:
    """Parses the ``dataset.json`` at ``path`` (its bytes ``data`` when already read), of either
    layout: a version-2 split's shard table (next to it) is read and checked when its entries
    are first used. The one way the reader and the tools load a manifest.

    Raises:
      ValueError: if it is not a valid manifest (naming the file), or later, when a shard
        table is damaged.
      FileNotFoundError: later, when a shard table it names is missing.
    """
    from schemas.shard_table import decode_manifest  # pyarrow only once a dataset is read

    directory = posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)

    def read_file(relative: str) -> bytes:
        table = join(directory or ".", relative)
        if not exists(table):
            raise FileNotFoundError(f"{table} does not exist")
        return read_bytes(table)

    try:
        return decode_manifest(read_bytes(path) if data is None else data, read_file)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def label_names(source: str | os.PathLike[str]) -> tuple[str, ...] | None:
    """Class names indexed by label, or None when the source has no manifest."""
    manifest = load_manifest(source)
    return None if manifest is None else manifest.label_names


def num_classes(source: str | os.PathLike[str]) -> int | None:
    """Number of classes, or None when the source has no manifest."""
    names = label_names(source)
    return None if names is None else len(names)


def resolve_source(
    source: str | os.PathLike[str], split: str = "train", *, cache: CacheConfig | None = None
) -> ResolvedSource:
    """Resolves ``source`` to the shard files of ``split``.

    Args:
      source: a dataset root or its ``dataset.json`` (shards and label names come from the
        manifest), or a glob / single path of foreign TFRecord files (``split`` is then only a
        name: every matched file is read).
      split: the split to read from a manifest.
      cache: the shard cache for sources TensorFlow cannot open (``s3://``, emulated ``gs://``);
        None for the default directory and size (``tfrecord_io.cache.open_default_cache``).

    Returns:
      The resolved source.

    Raises:
      FileNotFoundError: if nothing matches, naming the source and what was expected.
      KeyError: if the manifest has no such split (naming the splits it has).
      ValueError: if the manifest is invalid or the split has no shards.
    """
    text = _as_str(source)
    # Resolved once: a ``latest`` pointer may move while we read.
    path = _manifest_path(text)
    manifest = None if path is None else load_manifest(path)
    if manifest is not None and path is not None:
        # Adopted shards may stay where they are, apart from dataset.json (``shard_root``).
        root = manifest.shard_root or posixpath.dirname(path) or "."
        info = manifest.split(split)
        if not info.num_shards:
            raise ValueError(f"split {split!r} of {text} has no shards")
        return ResolvedSource(
            text,
            split,
            manifest,
            ShardFiles(root, info.shards),
            manifest.label_names,
            streamed=object_store_for(root) is not None,
            cache_config=cache,
        )

    if has_glob(text):
        paths = _glob(text)
        if not paths:
            raise FileNotFoundError(f"no TFRecord files match {text!r}")
    elif _isdir(text):
        raise FileNotFoundError(
            f"{text} has no {MANIFEST_NAME}: pass a dataset written by "
            f"beam_pipelines.images_to_tfrecord, or a glob of TFRecord files such as "
            f"'{join(text, '*')}'"
        )
    elif exists(text):
        paths = [text]
    else:
        raise FileNotFoundError(
            f"source {text!r} does not exist; expected a dataset directory with "
            f"{MANIFEST_NAME}, or a glob of TFRecord files"
        )
    shards = tuple(ShardFile(path=p, num_bytes=file_size(p)) for p in paths)
    return ResolvedSource(
        text,
        split,
        None,
        shards,
        None,
        streamed=object_store_for(text) is not None,
        cache_config=cache,
    )
