"""Incremental builds (``--base PREVIOUS_DATASET``): reuse a published dataset's stored examples.

An example can be reused when the base holds the same source bytes (same key) prepared with the
same image options: its stored bytes are then exactly what preparing the source again would
give. The image step asks ``BaseDataset.reuse`` after hashing the source; on a hit it gets the
base's serialised example, read by byte range through the base's catalog (shard, offset,
length), CRC-checked and with its key checked, never decoded, and with the label, class text and
file name rewritten (by ``schemas.serialize_record``, as a clean build writes them) where they
changed. On a miss it prepares the image as usual.

``open_base`` refuses, naming the problem, a base that:

* has no ``dataset.json`` (never published, or a build is writing it: an overwrite unpublishes
  first), or has a ``.staging/`` directory (a build is writing into it);
* lists no catalogs, or a catalog whose size, SHA-256, schema or row count differs from what
  ``dataset.json`` says, or whose rows point outside the shards ``dataset.json`` lists;
* lists a shard that is missing or of another size.

A record found damaged while reusing (a CRC or key mismatch) fails the build with the same kind
of message, rather than slip a wrong example in. The base is only ever read.

Image options that differ turn reuse off for the whole build (``BaseDataset.reason``), logged
as "image options differ from the base (image_size 256 -> 224): no examples reused".

Memory: each worker process holds a compact lookup of the base (``BaseIndex``): about 75 bytes
per base example (an 8-byte key prefix, its location, a digest of its names and the catalog
columns a reused example copies), 95 MB for ImageNet's 1.28 M images. It is built one catalog
batch at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.elements import CatalogMeta, StagedRecord
from beam_pipelines.engines.filesystems import read_object, read_range
from beam_pipelines.output.publish import read_manifest_file
from catalog.keys import key_prefixes
from catalog.table import catalog_filename, check_schema
from schemas import MANIFEST_NAME, ImageRecord, Manifest, record_from_example, serialize_record
from schemas.framing import FrameError, payload_of_frame
from schemas.lineage import (
    LATEST_NAME,
    describe_option_changes,
    image_options,
    parse_latest_pointer,
)
from schemas.manifest import FileInfo

__all__ = [
    "BaseRefusedError",
    "BaseDamagedError",
    "BaseIndex",
    "BaseDataset",
    "Reused",
    "BaseSpec",
    "naming_digest",
    "resolve_base_root",
    "open_base",
    "load_base",
    "lineage_block",
]

_log = logging.getLogger(__name__)
_STAGING = ".staging"
# Catalog columns a reused example copies into its own catalog row.
_COPIED = (
    "height", "width", "format", "source_format", "source_height", "source_width", "phash",
    "window_phash",
)  # fmt: skip
_LOOKUP_COLUMNS = ("key", "uri", "label", "text", "shard", "offset", "length", *_COPIED)


class BaseRefusedError(ValueError):
    """The base cannot be used: not published, being written, or failing its own checks."""


class BaseDamagedError(RuntimeError):
    """A record of the base was found damaged while reusing it (names the shard and offset)."""


def _read(path: str) -> bytes:
    return read_object(path)


def _exists(path: str) -> bool:
    return FileSystems.exists(path)


def resolve_base_root(base: str) -> str:
    """The dataset directory ``--base`` names: itself, or the version its ``latest`` names.

    Raises:
      BaseRefusedError: if neither ``dataset.json`` nor a ``latest`` pointer is there.
    """
    root = base.rstrip("/")
    if FileSystems.split(root)[1] == LATEST_NAME and not _exists(
        FileSystems.join(root, MANIFEST_NAME)
    ):
        pointer, root = root, FileSystems.split(root)[0]
    else:
        pointer = FileSystems.join(root, LATEST_NAME)
    if _exists(FileSystems.join(root, MANIFEST_NAME)) or not _exists(pointer):
        return root
    try:
        version = parse_latest_pointer(_read(pointer), name=pointer)
    except ValueError as e:
        raise BaseRefusedError(f"--base {base}: {e}") from e
    return FileSystems.join(root, version)


@dataclasses.dataclass(frozen=True)
class BaseIndex:
    """The base's examples, sorted by key prefix, with where each is and what it copies.

    Attributes:
      prefixes: the first 64 bits of each key (sorted).
      shard: index into ``shards`` per example.
      offset, length: the example's frame in its shard.
      naming: a 64-bit digest of each example's label, class text and file name
        (``naming_digest``): where a new build names a source the same, the stored example is
        used as it lies.
      shards: the shard file names.
      copied: per column of ``_COPIED``, the catalog's values (Arrow arrays, in ``prefixes``
        order).
    """

    prefixes: np.ndarray
    shard: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    naming: np.ndarray
    shards: tuple[str, ...]
    copied: Mapping[str, pa.Array]

    def rows(self, key: str) -> range:
        """Rows whose key prefix equals ``key``'s (almost always zero or one)."""
        prefix = np.uint64(int(key[:16], 16))
        lo = int(np.searchsorted(self.prefixes, prefix, side="left"))
        hi = int(np.searchsorted(self.prefixes, prefix, side="right"))
        return range(lo, hi)

    @property
    def num_examples(self) -> int:
        return len(self.prefixes)


class Reused:
    """A reused example: its serialised bytes and its catalog metadata."""

    __slots__ = ("serialized", "meta", "rewritten")

    def __init__(self, serialized: bytes, meta: CatalogMeta, rewritten: bool) -> None:
        self.serialized = serialized
        self.meta = meta
        self.rewritten = rewritten


@dataclasses.dataclass
class BaseDataset:
    """An opened, checked base; ``reuse`` answers the image step's question for one source.

    Attributes:
      root: the base's dataset directory.
      manifest: its manifest.
      manifest_sha256: SHA-256 of its ``dataset.json`` bytes (recorded in the new lineage).
      reason: why no example can be reused (image options differ), or ``""``.
      index: the lookup; None when ``reason`` is set (nothing to look up).
    """

    root: str
    manifest: Manifest
    manifest_sha256: str
    reason: str
    index: BaseIndex | None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tool_version: str = ""

    @property
    def reusable(self) -> bool:
        return self.index is not None

    def may_hold(self, sha256: str) -> bool:
        """Whether ``locate`` or ``reuse`` might find ``sha256``: False means surely not.
        Reads the in-memory index only, so any thread may ask."""
        return self.index is not None and len(self.index.rows(sha256)) > 0

    @property
    def spec(self) -> BaseSpec:
        """What a worker needs to open this base again (small, pickles cheaply)."""
        return BaseSpec(self.root, self.manifest_sha256, dict(self.options), self.tool_version)

    def locate(
        self, sha256: str, *, uri: str, label: int, text: str, source_bytes: int
    ) -> StagedRecord | None:
        """Where the base holds the very example a clean build would write for this source:
        the same key named the same (label, class text, file name). None otherwise (``reuse``
        then reads it and rewrites its names).

        The location points into the base's shard (an absolute path or URI in ``file``), so
        the example is neither read nor staged here: the shard writer copies its frame, whose
        CRCs it checks, from the base. The key is the catalog's, which ``open_base`` checked
        against ``dataset.json``.
        """
        index = self.index
        if index is None:
            return None
        rows = index.rows(sha256)
        if len(rows) != 1:
            return None  # absent, or a 64-bit prefix shared by two keys: let reuse decide
        row = rows[0]
        if index.naming[row] != naming_digest(label, text, uri):
            return None
        shard = index.shards[int(index.shard[row])]
        meta = self._copied_meta(row, label, text, source_bytes)
        return StagedRecord(
            sha256,
            uri,
            FileSystems.join(self.root, shard),
            int(index.offset[row]),
            int(index.length[row]),
            meta,
        )

    def reuse(
        self, sha256: str, *, uri: str, label: int, text: str, source_bytes: int
    ) -> Reused | None:
        """The base's example for source bytes ``sha256``, relabelled as asked, or None.

        Args:
          sha256: the source bytes' key.
          uri, label, text: the source's file name, label and class name in the new build.
          source_bytes: the source's size (for the catalog row).

        Raises:
          BaseDamagedError: if the record the catalog points at is damaged or holds another key.
        """
        index = self.index
        if index is None:
            return None
        for row in index.rows(sha256):
            shard = index.shards[int(index.shard[row])]
            payload = self._fetch(shard, int(index.offset[row]), int(index.length[row]))
            try:
                record = record_from_example(payload)
            except ValueError as e:
                raise BaseDamagedError(
                    f"--base {self.root}: {shard} record at byte {index.offset[row]} does not "
                    f"parse ({e}); repair the base or build without --base"
                ) from e
            if record.sha256 != sha256:
                if record.sha256[:16] == sha256[:16]:
                    continue  # another key with the same 64-bit prefix
                raise BaseDamagedError(
                    f"--base {self.root}: {shard} record at byte {index.offset[row]} holds key "
                    f"{record.sha256}, but the catalog says {sha256}; the catalog does not "
                    "describe the shards (repair the base or build without --base)"
                )
            rewritten = (record.label, record.text, record.filename) != (label, text, uri)
            if rewritten:
                record = dataclasses.replace(record, label=label, text=text, filename=uri)
                payload = serialize_record(record)
            return Reused(payload, self._meta(row, record, source_bytes), rewritten)
        return None

    def _fetch(self, shard: str, offset: int, length: int) -> bytes:
        path = FileSystems.join(self.root, shard)
        frame = read_range(path, offset, offset + length)
        try:
            payload = bytes(payload_of_frame(frame))
        except FrameError as e:
            raise BaseDamagedError(
                f"--base {self.root}: {shard} record at byte {offset} ({length} bytes) fails its "
                f"TFRecord CRC check ({e}): the base is damaged; repair it or build without --base"
            ) from e
        return payload

    def _meta(self, row: int, record: ImageRecord, source_bytes: int) -> CatalogMeta:
        return self._copied_meta(row, record.label, record.text, source_bytes)

    def _copied_meta(self, row: int, label: int, text: str, source_bytes: int) -> CatalogMeta:
        copied = {name: self.index.copied[name][row].as_py() for name in _COPIED}  # type: ignore[union-attr]
        return CatalogMeta(
            label=label,
            text=text,
            height=copied["height"],
            width=copied["width"],
            format=copied["format"],
            source_format=copied["source_format"],
            source_bytes=source_bytes,
            source_height=copied["source_height"],
            source_width=copied["source_width"],
            phash=copied["phash"],
            # The base's near-duplicate features as they are: a base whose features were
            # taken otherwise is not reused (near_duplicate_windows is an image option).
            window_phash=None if copied["window_phash"] is None else tuple(copied["window_phash"]),
        )


def naming_digest(label: int | None, text: str | None, uri: str | None) -> int:
    """64 bits of BLAKE2b over an example's label, class text and file name."""
    data = f"{label}\x00{text}\x00{uri}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _refuse(base: str, problem: str) -> BaseRefusedError:
    return BaseRefusedError(
        f"--base {base} is refused: {problem}. Fix or rebuild the base, or build without --base"
    )


def _load_manifest(root: str, base: str) -> tuple[Manifest, str]:
    path = FileSystems.join(root, MANIFEST_NAME)
    if not _exists(path):
        raise _refuse(
            base,
            f"{path} does not exist: the base is not published (it was never completed, or a "
            "build is rewriting it)",
        )
    if (
        _exists(FileSystems.join(root, _STAGING))
        or FileSystems.match([FileSystems.join(root, _STAGING, "*")], limits=[1])[0].metadata_list
    ):
        raise _refuse(
            base,
            f"{FileSystems.join(root, _STAGING)} exists: a build is writing into the base (or "
            "failed there and awaits --resume)",
        )
    data = _read(path)
    try:
        manifest = read_manifest_file(path, data)
        manifest.all_shards()  # a damaged or missing shard table refuses the base now
    except (ValueError, FileNotFoundError) as e:
        raise _refuse(base, f"{path}: {e}") from e
    return manifest, hashlib.sha256(data).hexdigest()


def _check_shards(root: str, base: str, manifest: Manifest) -> None:
    listed = {s.file: s.num_bytes for s in manifest.all_shards()}
    if not listed:
        return
    found = {
        FileSystems.split(m.path)[1]: m.size_in_bytes
        for m in FileSystems.match([FileSystems.join(root, "*.tfrecord")])[0].metadata_list
    }
    for name, size in sorted(listed.items()):
        if name not in found:
            raise _refuse(base, f"shard {FileSystems.join(root, name)} is missing")
        if found[name] != size:
            raise _refuse(
                base,
                f"shard {FileSystems.join(root, name)} is {found[name]} bytes, dataset.json "
                f"says {size}",
            )


_BATCH_ROWS = 65536


class _Pieces:
    """The lookup's columns, gathered one catalog batch at a time."""

    def __init__(self) -> None:
        self.prefixes: list[np.ndarray] = []
        self.shard: list[np.ndarray] = []
        self.offset: list[np.ndarray] = []
        self.length: list[np.ndarray] = []
        self.naming: list[np.ndarray] = []
        self.copied: dict[str, list[pa.Array]] = {name: [] for name in _COPIED}
        self.shards: dict[str, int] = {}

    def add(self, batch: pa.RecordBatch, base: str, sizes: Mapping[str, int]) -> None:
        prefixes = key_prefixes(batch.column("key"))
        if prefixes is None:
            raise _refuse(base, "its catalog has keys that are not SHA-256 hex digests")
        names = pc.dictionary_encode(batch.column("shard"))
        for name in names.dictionary.to_pylist():
            if name not in sizes:
                raise _refuse(base, f"its catalog names a shard dataset.json does not list: {name}")
            self.shards.setdefault(name, len(self.shards))
        remap = np.array([self.shards[n] for n in names.dictionary.to_pylist()], np.int32)
        codes = remap[np.asarray(names.indices, np.int64)] if len(remap) else np.zeros(0, np.int32)
        offset = np.asarray(batch.column("offset"), np.int64)
        length = np.asarray(batch.column("length"), np.int64)
        limit = np.array([sizes[n] for n in self.shards], np.int64)[codes]
        if (offset < 0).any() or (length < 17).any() or (offset + length > limit).any():
            raise _refuse(base, "its catalog has records outside their shards")
        labels = batch.column("label").to_pylist()
        texts = batch.column("text").to_pylist()
        uris = batch.column("uri").to_pylist()
        naming = np.fromiter(map(naming_digest, labels, texts, uris), np.uint64, batch.num_rows)
        self.prefixes.append(prefixes)
        self.shard.append(codes)
        self.offset.append(offset)
        self.length.append(length)
        self.naming.append(naming)
        for name in _COPIED:
            self.copied[name].append(batch.column(name))

    def index(self) -> BaseIndex:
        if not self.prefixes:
            return BaseIndex(
                np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.int64),
                np.zeros(0, np.int64), np.zeros(0, np.uint64), (),
                {name: pa.array([]) for name in _COPIED},
            )  # fmt: skip
        prefixes = np.concatenate(self.prefixes)
        order = np.argsort(prefixes, kind="stable")
        taken = pa.array(order)
        return BaseIndex(
            prefixes=prefixes[order],
            shard=np.concatenate(self.shard)[order],
            offset=np.concatenate(self.offset)[order],
            length=np.concatenate(self.length)[order],
            naming=np.concatenate(self.naming)[order],
            shards=tuple(self.shards),
            copied={
                name: pa.chunked_array(arrays).combine_chunks().take(taken)
                for name, arrays in self.copied.items()
            },
        )


def _load_index(root: str, base: str, manifest: Manifest) -> BaseIndex:
    """The base's lookup, read catalog file by file (a split's catalog or each of its
    partitions) and batch by batch: besides what it keeps (about 75 bytes an example), only
    one compressed catalog file and one batch are in memory."""
    sizes = {s.file: s.num_bytes for s in manifest.all_shards()}
    pieces = _Pieces()
    for split in sorted(manifest.splits):
        info = manifest.split(split)
        listed = info.catalog_files
        if not listed:
            if info.num_examples == 0:
                continue
            raise _refuse(
                base,
                f"dataset.json lists no catalog for split {split!r} (the base was built before "
                f"catalogs; expected {catalog_filename(split)})",
            )
        rows = sum(_load_catalog_file(root, base, file, pieces, sizes) for file in listed)
        if rows != info.num_examples:
            raise _refuse(
                base,
                f"the catalog of split {split!r} ({', '.join(f.file for f in listed)}) has "
                f"{rows} rows, dataset.json says the split holds {info.num_examples} examples",
            )
    return pieces.index()


def _load_catalog_file(
    root: str, base: str, listed: FileInfo, pieces: _Pieces, sizes: dict[str, int]
) -> int:
    """Adds one catalog file's rows to ``pieces``, after checking it; returns its rows."""
    path = FileSystems.join(root, listed.file)
    if not _exists(path):
        raise _refuse(base, f"catalog {path} is missing")
    blob = _read(path)
    if len(blob) != listed.num_bytes or hashlib.sha256(blob).hexdigest() != listed.sha256:
        raise _refuse(
            base,
            f"catalog {path} ({len(blob)} bytes) differs from what dataset.json lists "
            f"({listed.num_bytes} bytes, sha256 {listed.sha256[:12]}…)",
        )
    try:
        parquet = pq.ParquetFile(pa.BufferReader(blob))
        check_schema(parquet.schema_arrow, name=path)
        for batch in parquet.iter_batches(_BATCH_ROWS, columns=list(_LOOKUP_COLUMNS)):
            pieces.add(batch, base, sizes)
    except (ValueError, pa.ArrowInvalid, OSError) as e:
        if isinstance(e, BaseRefusedError):
            raise
        raise _refuse(base, f"catalog {path}: {e}") from e
    return parquet.metadata.num_rows


def open_base(
    base: str, *, options: Mapping[str, Any], tool_version: str, log: bool = True
) -> BaseDataset:
    """Opens and checks ``--base`` against the options of the build that wants to reuse it.

    Args:
      base: the previous dataset (directory or URI), or a versions root with ``latest``.
      options: the new build's manifest options (``PipelineConfig.manifest_options()``).
      tool_version: the new build's ``schemas.TOOL_VERSION``.
      log: log why nothing is reused, when the image options differ.

    Returns:
      The base. When image options differ, ``reason`` says how and nothing is looked up.

    Raises:
      BaseRefusedError: naming the problem, for a base that is not published, being written,
        or damaged (see the module doc).
    """
    root = resolve_base_root(base)
    manifest, digest = _load_manifest(root, base)
    old = image_options(manifest.options, tool_version=manifest.tool_version)
    new = image_options(options, tool_version=tool_version)
    if old != new:
        reason = (
            f"image options differ from the base ({describe_option_changes(old, new)}): no "
            "examples reused"
        )
        if log:
            _log.warning("%s", reason)
        return BaseDataset(root, manifest, digest, reason, None, dict(options), tool_version)
    _check_shards(root, base, manifest)
    index = _load_index(root, base, manifest)
    return BaseDataset(root, manifest, digest, "", index, dict(options), tool_version)


class BaseSpec(NamedTuple):
    """An opened base as the launcher saw it, for the image step's workers."""

    root: str
    manifest_sha256: str
    options: dict[str, Any]
    tool_version: str


_OPENED: dict[BaseSpec | tuple, BaseDataset] = {}
_OPENED_LOCK = threading.Lock()


def load_base(spec: BaseSpec) -> BaseDataset:
    """The base a worker reuses from: opened once per process (every image-step instance of a
    process shares its lookup) and checked to be the one the launcher opened.

    Raises:
      BaseRefusedError: if the base changed since the launcher opened it, or fails its checks.
    """
    key = (spec.root, spec.manifest_sha256)
    with _OPENED_LOCK:
        if key not in _OPENED:
            base = open_base(
                spec.root, options=spec.options, tool_version=spec.tool_version, log=False
            )
            if base.manifest_sha256 != spec.manifest_sha256:
                raise _refuse(
                    spec.root,
                    "its dataset.json changed while this build was running (sha256 "
                    f"{spec.manifest_sha256[:12]}… when the build started, now "
                    f"{base.manifest_sha256[:12]}…)",
                )
            _OPENED[key] = base
        return _OPENED[key]


def lineage_block(base: BaseDataset, *, reused: int, prepared: int) -> dict[str, Any]:
    """The ``lineage`` block of the new ``dataset.json``."""
    return {
        "base_manifest_sha256": base.manifest_sha256,
        "reused": reused,
        "prepared": prepared,
    }
