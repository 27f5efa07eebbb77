"""``dataset.json``: the manifest that commits a dataset and tells readers what it holds.

The writer publishes ``dataset.json`` last; readers trust only the shards it lists. This module
is storage-agnostic: it converts between ``Manifest`` objects and JSON text, and names files.
Reading and writing the bytes is the caller's job (Beam FileSystems in the pipeline, the shard
cache or local files in the reader).

Two layouts, told apart by ``format_version``: version 1 (every dataset written before it was
recorded) lists each split's shards inline; version 2, written since, keeps ``dataset.json``
small and puts each split's shard entries in a Parquet shard table (``shards-<split>.parquet``,
``schemas.shard_table``) that ``dataset.json`` names with its size and SHA-256. A version-2
split read here alone has ``TableShards`` whose entries are not loaded
(``schemas.shard_table.decode_manifest`` loads them through the caller's reads).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from schemas.constants import (
    CROPS,
    ENCODINGS,
    FIVE_DIGIT_SHARDS,
    MAX_SHARDS,
    TOOL_NAME,
    TOOL_VERSION,
)
from schemas.image_example import SCHEMA_VERSION

__all__ = [
    "MANIFEST_NAME",
    "REJECTED_NAME",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "INLINE_FORMAT",
    "TOOL_NAME",
    "TOOL_VERSION",
    "ENCODINGS",
    "CROPS",
    "ShardInfo",
    "SplitInfo",
    "TableShards",
    "UnloadedShards",
    "TableOpener",
    "Counts",
    "FileInfo",
    "ImageSpec",
    "Manifest",
    "shard_filename",
    "shard_number_width",
    "parse_shard_filename",
    "shard_table_name",
    "check_format_version",
]

MANIFEST_NAME = "dataset.json"
REJECTED_NAME = "rejected.jsonl"
#: The layout of ``dataset.json`` this build writes: shard entries in per-split shard tables.
FORMAT_VERSION = 2
#: The layout of every dataset written before ``format_version`` existed: shards inline.
INLINE_FORMAT = 1
#: The layouts this build reads.
FORMAT_VERSIONS = (INLINE_FORMAT, FORMAT_VERSION)
COLOR_SPACES = ("sRGB",)

_SHARD_RE = re.compile(
    r"^(?P<split>[a-z][a-z0-9_]*)-(?P<index>\d{5,})-of-(?P<count>\d{5,})\.tfrecord$"
)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def shard_number_width(count: int) -> int:
    """Digits of both numbers in the names of a split of ``count`` shards: five, or more when
    ``count`` needs them (tfds' own rule, ``naming._num_digits_needed``).

    Up to ``FIVE_DIGIT_SHARDS`` shards the names are ``train-00003-of-00016.tfrecord``, as
    they always were; 100,000 shards are ``train-000003-of-100000.tfrecord``.
    """
    return max(5, len(str(count)))


def shard_filename(split: str, index: int, count: int) -> str:
    """Names a shard: ``train-00003-of-00016.tfrecord``; both numbers widen together past
    ``FIVE_DIGIT_SHARDS`` (``train-000003-of-100000.tfrecord``), so names still sort in shard
    order within a split and are the names tfds computes for its ``{SHARD_X_OF_Y}``.

    Raises:
      ValueError: if ``split`` is not a lowercase identifier, ``index`` is not in
        ``[0, count)`` or ``count`` is over ``MAX_SHARDS``.
    """
    if not re.match(r"^[a-z][a-z0-9_]*$", split):
        raise ValueError(f"split name must be a lowercase identifier like 'train', got {split!r}")
    if not 0 <= index < count or count > MAX_SHARDS:
        raise ValueError(
            f"shard index must be in [0, count) with count <= {MAX_SHARDS}, got {index} of {count}"
        )
    width = shard_number_width(count)
    return f"{split}-{index:0{width}d}-of-{count:0{width}d}.tfrecord"


def parse_shard_filename(name: str) -> tuple[str, int, int]:
    """Inverse of ``shard_filename``: returns ``(split, index, count)``.

    Only the names ``shard_filename`` gives are accepted: both numbers as wide as the count
    needs (five digits up to ``FIVE_DIGIT_SHARDS``), so each shard has exactly one name.

    Raises:
      ValueError: if ``name`` is not a shard file name.
    """
    match = _SHARD_RE.match(name)
    if match:
        index, count = int(match["index"]), int(match["count"])
        width = shard_number_width(count)
        if len(match["index"]) == len(match["count"]) == width:
            return match["split"], index, count
    raise ValueError(
        "not a shard file name like 'train-00003-of-00016.tfrecord' (or, past "
        f"{FIVE_DIGIT_SHARDS} shards, 'train-000003-of-100000.tfrecord'): {name!r}"
    )


def _require_int(name: str, value: Any, minimum: int = 0) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _require_relative(what: str, file: Any) -> None:
    if not isinstance(file, str) or not file or file.startswith("/") or ".." in file.split("/"):
        raise ValueError(f"{what} file must be a relative path inside the dataset, got {file!r}")


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """A file that describes the shards (an index file, a catalog): its path relative to the
    dataset root, its size and its hash."""

    file: str
    num_bytes: int
    sha256: str

    def __post_init__(self) -> None:
        _require_relative("listed", self.file)
        _require_int("num_bytes", self.num_bytes)
        if not isinstance(self.sha256, str) or not _SHA256_RE.match(self.sha256):
            raise ValueError(
                f"{self.file} sha256 must be 64 lowercase hex digits, got {self.sha256!r}"
            )

    @classmethod
    def from_dict(cls, data: Any) -> FileInfo | None:
        return None if data is None else cls(**data)


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard file: its path relative to the dataset root, record count, size and hash, and
    its index file (``<stem>.idx``, one ``"<offset> <length>"`` line per record) if it has one."""

    file: str
    num_examples: int
    num_bytes: int
    sha256: str
    index: FileInfo | None = None

    def __post_init__(self) -> None:
        _require_relative("shard", self.file)
        _require_int("num_examples", self.num_examples)
        _require_int("num_bytes", self.num_bytes)
        if not isinstance(self.sha256, str) or not _SHA256_RE.match(self.sha256):
            raise ValueError(f"shard sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if self.index is not None and not isinstance(self.index, FileInfo):
            raise ValueError(f"shard index must be a FileInfo, got {self.index!r}")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.index is None:
            del data["index"]  # datasets without index files keep their earlier JSON
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardInfo:
        fields = dict(data)
        index = FileInfo.from_dict(fields.pop("index", None))
        return cls(**fields, index=index)


def shard_table_name(split: str) -> str:
    """Names a split's shard table (format version 2): ``shards-train.parquet``, next to
    ``dataset.json``. A republished dataset reuses the name: publishing first unpublishes the
    old ``dataset.json``, so no live manifest names a table being rewritten."""
    if not re.match(r"^[a-z][a-z0-9_]*$", split):
        raise ValueError(f"split name must be a lowercase identifier like 'train', got {split!r}")
    return f"shards-{split}.parquet"


class TableShards(Sequence[ShardInfo]):
    """A split's shard entries kept in a shard table rather than inline (format version 2).

    What ``dataset.json`` says of the table (its file, the split's shard count and shard bytes)
    is known without reading it: ``len()`` and ``total_bytes`` never load the table. Reading an
    entry loads it (``schemas.shard_table.ShardTable``) or, for a manifest parsed without
    access to its files, raises (``UnloadedShards``).
    """

    def __init__(self, table: FileInfo, num_shards: int, total_bytes: int) -> None:
        _require_int("num_shards", num_shards)
        _require_int("num_bytes", total_bytes)
        self.table = table
        self.num_shards = num_shards
        self.total_bytes = total_bytes

    def __len__(self) -> int:
        return self.num_shards

    @overload
    def __getitem__(self, index: int) -> ShardInfo: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[ShardInfo, ...]: ...

    def __getitem__(self, index: int | slice) -> ShardInfo | tuple[ShardInfo, ...]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash((self.table, self.num_shards))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.file!r}, {self.num_shards} shards)"


class UnloadedShards(TableShards):
    """The entries of a shard table that the manifest was parsed without: any read raises."""

    def __getitem__(self, index: int | slice) -> Any:
        raise ValueError(
            f"the shard entries of this dataset are in {self.table.file}, which was not read: "
            "load the dataset with tfrecord_io.load_manifest (or beam_pipelines' read_manifest, "
            "or schemas.shard_table.decode_manifest with a function that reads its files)"
        )


#: Builds a split's ``TableShards`` from what ``dataset.json`` says of its table:
#: ``(split, table, num_shards, num_examples, num_bytes)``.
TableOpener = Callable[[str, FileInfo, int, int, int], TableShards]


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """A split (``train``, ``validation``) and its shards, in read order, and its catalog
    (one row per example) if it has one.

    The catalog is one file (``catalog``, ``catalog-<split>.parquet``) or, for a split whose
    catalog was written in partitions of consecutive shards, the partitions in order
    (``catalog_partitions``, ``catalog-<split>-00000-of-00003.parquet`` ...); never both.
    ``catalog_files`` gives either as a tuple in read order.

    ``shards`` is a tuple when listed inline, or ``TableShards`` for a shard table (format
    version 2), whose record counts are checked against ``num_examples`` when it loads.
    ``class_counts`` maps every class name, in label order, to its examples in the split (None
    for datasets written before it was recorded).
    """

    num_examples: int
    shards: Sequence[ShardInfo]
    catalog: FileInfo | None = None
    class_counts: Mapping[str, int] | None = None
    catalog_partitions: tuple[FileInfo, ...] = ()

    def __post_init__(self) -> None:
        _require_int("num_examples", self.num_examples)
        if self.catalog is not None and self.catalog_partitions:
            raise ValueError(
                f"a split lists either one catalog or catalog partitions, got both: "
                f"{self.catalog.file} and {len(self.catalog_partitions)} partitions"
            )
        if not isinstance(self.shards, TableShards):
            total = sum(s.num_examples for s in self.shards)
            if total != self.num_examples:
                raise ValueError(
                    f"split num_examples {self.num_examples} != sum over its shards {total}"
                )
        if self.class_counts is not None:
            for name, count in self.class_counts.items():
                _require_int(f"class_counts[{name!r}]", count)
            if sum(self.class_counts.values()) != self.num_examples:
                raise ValueError(
                    f"split class_counts add up to {sum(self.class_counts.values())}, "
                    f"not num_examples {self.num_examples}"
                )

    @property
    def catalog_files(self) -> tuple[FileInfo, ...]:
        """The split's catalog files in row order: one, its partitions, or none."""
        return (self.catalog,) if self.catalog is not None else tuple(self.catalog_partitions)

    @property
    def num_shards(self) -> int:
        """Shards in the split (never loads a shard table)."""
        return len(self.shards)

    @property
    def num_bytes(self) -> int:
        """Bytes of the split's shard files (never loads a shard table)."""
        if isinstance(self.shards, TableShards):
            return self.shards.total_bytes
        return sum(s.num_bytes for s in self.shards)


@dataclasses.dataclass(frozen=True)
class Counts:
    """Where every input went: ``input == written + rejected + duplicates``, exactly.

    ``skipped`` counts hidden and system files (``.DS_Store``, ``__MACOSX``...) that were never
    inputs. ``upscaled`` counts the written examples stored larger than their source (shorter
    side), ``too_small`` the rejected sources below ``--min_source_side``; both are None in a
    dataset made before they were recorded (and then left out of ``dataset.json``).
    """

    input: int
    written: int
    rejected: int
    duplicates: int
    skipped: int = 0
    upscaled: int | None = None
    too_small: int | None = None

    def __post_init__(self) -> None:
        for name in ("input", "written", "rejected", "duplicates", "skipped"):
            _require_int(name, getattr(self, name))
        if self.input != self.written + self.rejected + self.duplicates:
            raise ValueError(
                f"counts do not add up: input {self.input} != written {self.written} + "
                f"rejected {self.rejected} + duplicates {self.duplicates}"
            )
        for name, total in (("upscaled", self.written), ("too_small", self.rejected)):
            value = getattr(self, name)
            if value is None:
                continue
            _require_int(name, value)
            if value > total:
                raise ValueError(f"counts.{name} {value} is more than its total {total}")

    def to_dict(self) -> dict[str, int]:
        """The counts as ``dataset.json`` holds them: the optional ones only when known."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """How the stored images were prepared, so a reader can pick its decode path.

    ``color_space`` is that of the stored pixels: always ``sRGB`` (embedded ICC profiles are
    applied while preparing; images without one are taken as sRGB). Manifests written before
    the field existed read as ``sRGB`` too, which is what their images were assumed to be.
    """

    encoding: str
    image_size: int
    crop: str
    color_space: str = "sRGB"

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.color_space not in COLOR_SPACES:
            raise ValueError(f"color_space must be one of {COLOR_SPACES}, got {self.color_space!r}")
        _require_int("image_size", self.image_size, minimum=1)
        if self.crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}, got {self.crop!r}")
        if self.encoding == "raw" and self.crop != "center":
            raise ValueError(
                "encoding 'raw' requires crop 'center' (RAW examples must share one shape)"
            )


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The content of ``dataset.json``.

    It holds no timestamps or host names, so that the same input and options give the same
    manifest on every runner.
    """

    label_names: tuple[str, ...]
    splits: Mapping[str, SplitInfo]
    counts: Counts
    image: ImageSpec
    rejected_file: str = REJECTED_NAME
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Where the shard files are when they are not next to dataset.json (shards adopted in place
    # by ``dataset_tools.adopt --output``): a directory or URI. Index files and catalogs are
    # always relative to dataset.json's directory.
    shard_root: str | None = None
    schema_version: int = SCHEMA_VERSION
    tool: str = TOOL_NAME
    tool_version: str = TOOL_VERSION
    # An incremental build's provenance (``--base``): the base's dataset.json SHA-256 and the
    # examples reused from it and prepared anew. The only part of dataset.json in which an
    # incremental build differs from a clean one; absent from clean builds.
    lineage: Mapping[str, Any] | None = None
    # The layout of dataset.json: INLINE_FORMAT (shards listed inline, every dataset written
    # before this field) or FORMAT_VERSION (per-split shard tables).
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        check_format_version(self.format_version)
        if self.lineage is not None and not isinstance(self.lineage, Mapping):
            raise ValueError(f"lineage must be a JSON object, got {self.lineage!r}")
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"dataset schema_version {self.schema_version!r} is not supported; this build reads "
                f"version {SCHEMA_VERSION}"
            )
        if len(set(self.label_names)) != len(self.label_names) or not all(
            isinstance(n, str) and n for n in self.label_names
        ):
            raise ValueError(
                f"label_names must be distinct non-empty strings, got {list(self.label_names)!r}"
            )
        for name, split in self.splits.items():
            if not re.match(r"^[a-z][a-z0-9_]*$", name):
                raise ValueError(f"split name must be a lowercase identifier, got {name!r}")
            if split.class_counts is not None and set(split.class_counts) != set(self.label_names):
                raise ValueError(
                    f"split {name!r} has class_counts for {sorted(split.class_counts)}, but the "
                    f"classes are {list(self.label_names)}"
                )
        written = sum(s.num_examples for s in self.splits.values())
        if written != self.counts.written:
            raise ValueError(
                f"counts.written {self.counts.written} != examples in splits {written}"
            )

    def split(self, name: str) -> SplitInfo:
        """Returns a split by name.

        Raises:
          KeyError: naming the split and the splits the dataset has.
        """
        if name not in self.splits:
            raise KeyError(f"split {name!r} not in dataset; it has {sorted(self.splits)}")
        return self.splits[name]

    def to_dict(self, tables: Mapping[str, FileInfo] | None = None) -> dict[str, Any]:
        """The manifest as ``dataset.json`` holds it, in its ``format_version``'s layout.

        Args:
          tables: for format version 2, each split's shard table as written
            (``schemas.shard_table.encode_manifest`` gives them); a split missing here must have
            ``TableShards``, whose table is named as it was read.

        Raises:
          ValueError: if a split of a version-2 manifest has no shard table to name.
        """
        return {
            **({"format_version": self.format_version} if self.format_version > 1 else {}),
            "schema_version": self.schema_version,
            "tool": self.tool,
            "tool_version": self.tool_version,
            "label_names": list(self.label_names),
            "image": dataclasses.asdict(self.image),
            "splits": {
                name: self._split_dict(name, split, tables or {})
                for name, split in sorted(self.splits.items())
            },
            "counts": self.counts.to_dict(),
            "rejected_file": self.rejected_file,
            "options": dict(self.options),
            **({"shard_root": self.shard_root} if self.shard_root is not None else {}),
            **({"lineage": dict(self.lineage)} if self.lineage is not None else {}),
        }

    def _split_dict(
        self, name: str, split: SplitInfo, tables: Mapping[str, FileInfo]
    ) -> dict[str, Any]:
        data: dict[str, Any] = {"num_examples": split.num_examples}
        if self.format_version == INLINE_FORMAT:
            data["shards"] = [s.to_dict() for s in split.shards]
        else:
            table = tables.get(name)
            if table is None and isinstance(split.shards, TableShards):
                table = split.shards.table
            if table is None:
                raise ValueError(
                    f"split {name!r} has no shard table to name in dataset.json: encode the "
                    "manifest with schemas.shard_table.encode_manifest"
                )
            data["num_shards"] = split.num_shards
            data["num_bytes"] = split.num_bytes
            data["shard_table"] = dataclasses.asdict(table)
        if split.catalog is not None:
            data["catalog"] = dataclasses.asdict(split.catalog)
        if split.catalog_partitions:
            data["catalog_partitions"] = [dataclasses.asdict(f) for f in split.catalog_partitions]
        if split.class_counts is not None:
            data["class_counts"] = dict(split.class_counts)
        return data

    def to_json(self, tables: Mapping[str, FileInfo] | None = None) -> str:
        """Deterministic JSON text (sorted keys, fixed indentation, trailing newline).

        Raises:
          ValueError: as ``to_dict``.
        """
        return json.dumps(self.to_dict(tables), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], open_table: TableOpener | None = None) -> Manifest:
        """Builds and validates a manifest from parsed JSON, in either layout.

        Args:
          data: the parsed ``dataset.json``.
          open_table: for format version 2, builds each split's ``TableShards`` (the caller's
            reads of the table files); None leaves them ``UnloadedShards``.

        Raises:
          ValueError: naming the missing or bad field, or the format version this build does
            not read.
        """
        version = data.get("format_version", INLINE_FORMAT)
        check_format_version(version)
        try:
            splits = {
                name: SplitInfo(
                    num_examples=split["num_examples"],
                    shards=_split_shards(name, split, version, open_table),
                    catalog=FileInfo.from_dict(split.get("catalog")),
                    class_counts=split.get("class_counts"),
                    catalog_partitions=tuple(
                        FileInfo(**f) for f in split.get("catalog_partitions", ())
                    ),
                )
                for name, split in data["splits"].items()
            }
            return cls(
                label_names=tuple(data["label_names"]),
                splits=splits,
                counts=Counts(**data["counts"]),
                image=ImageSpec(**data["image"]),
                rejected_file=data["rejected_file"],
                options=dict(data.get("options", {})),
                schema_version=data["schema_version"],
                tool=data.get("tool", TOOL_NAME),
                tool_version=data.get("tool_version", "unknown"),
                shard_root=data.get("shard_root"),
                lineage=data.get("lineage"),
                format_version=version,
            )
        except KeyError as e:
            raise ValueError(f"dataset.json is missing field {e}") from e
        except TypeError as e:
            raise ValueError(f"dataset.json has a malformed field: {e}") from e

    @classmethod
    def from_json(cls, text: str | bytes, open_table: TableOpener | None = None) -> Manifest:
        """Parses ``dataset.json`` text (``open_table`` as in ``from_dict``).

        Raises:
          ValueError: if the text is not JSON or does not describe a valid dataset.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"dataset.json is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"dataset.json must hold a JSON object, got {type(data).__name__}")
        return cls.from_dict(data, open_table)

    def with_format(self, format_version: int) -> Manifest:
        """The same dataset in another layout (``dataset_tools`` and tests write version 1
        with it; every entry is read, so a shard table loads)."""
        if format_version == INLINE_FORMAT:
            splits = {
                name: dataclasses.replace(split, shards=tuple(split.shards))
                for name, split in self.splits.items()
            }
            return dataclasses.replace(self, splits=splits, format_version=format_version)
        return dataclasses.replace(self, format_version=format_version)

    def all_shards(self) -> Sequence[ShardInfo]:
        """Every shard of every split, splits in name order."""
        return [s for _, split in sorted(self.splits.items()) for s in split.shards]


def check_format_version(version: Any) -> None:
    """Raises unless this build reads a ``dataset.json`` of ``format_version`` ``version``.

    Raises:
      ValueError: naming the version and saying to upgrade for a newer one.
    """
    if isinstance(version, int) and not isinstance(version, bool) and version in FORMAT_VERSIONS:
        return
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise ValueError(
            f"dataset.json has format_version {version}, written by a newer {TOOL_NAME}; this "
            f"version ({TOOL_VERSION}) reads format versions {list(FORMAT_VERSIONS)}: upgrade "
            f"{TOOL_NAME} (pip install --upgrade {TOOL_NAME}) to read it"
        )
    raise ValueError(
        f"dataset.json format_version must be one of {list(FORMAT_VERSIONS)}, got {version!r}"
    )


def _split_shards(
    name: str, split: Mapping[str, Any], version: int, open_table: TableOpener | None
) -> Sequence[ShardInfo]:
    """A split's shard entries: inline (version 1) or its shard table (version 2)."""
    if version == INLINE_FORMAT:
        return tuple(ShardInfo.from_dict(shard) for shard in split["shards"])
    table = FileInfo(**split["shard_table"])
    num_shards, num_bytes = split["num_shards"], split["num_bytes"]
    if open_table is None:
        return UnloadedShards(table, num_shards, num_bytes)
    return open_table(name, table, num_shards, split["num_examples"], num_bytes)
