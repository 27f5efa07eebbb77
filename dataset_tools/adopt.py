"""``python -m dataset_tools.adopt "GLOB" [--label_offset 1] [--output DIR]``: adopt foreign shards.

Shards written by other tools (TensorFlow's ImageNet converters: ``train-00000-of-01024`` with
``image/encoded`` and a 1-based ``image/class/label``) are scanned once and described without
being rewritten: ``dataset.json`` (each shard's size, SHA-256 and record count), one index file
per shard, a catalog per split and, when tfds can read the shards where they are, its metadata.
From then on every tool that takes a dataset works on them: the reader, ``verify``,
``read_examples``, DALI and the ``tfrecord`` package through the index files.

Choices for shards that lack our keys:

* ``key`` is ``image/key/sha256`` when the examples carry one, else the SHA-256 of the stored
  ``image/encoded`` bytes (the converters store the source JPEG bytes for most images);
* ``label`` is the stored label minus ``--label_offset``;
* ``label_names[i]`` is the class's ``image/class/synset`` (distinct in ImageNet), else its
  ``image/class/text``, else ``class_<i>``;
* splits come from the file names (``<split>-NNNNN-of-NNNNN``), else ``--split``;
* source columns of the catalog are null (the sources are unknown).

Exit status: 0 when adopted, 1 when a shard is damaged (nothing is written), 2 for a usage error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import re
import sys
from collections.abc import Sequence
from typing import Any

from catalog.index_files import format_index, index_filename
from catalog.table import build_table, catalog_filename, table_bytes
from cliflags import plural
from dataset_tools.command import parse_tool_args, run_tool, tool_parser
from dataset_tools.foreign import ADOPTED_OPTION, ForeignRecord, parse_foreign
from objstore import storage_for
from schemas import (
    KEY_LABEL,
    MANIFEST_NAME,
    Counts,
    FileInfo,
    ImageSpec,
    Manifest,
    ShardInfo,
    SplitInfo,
)
from schemas.framing import FrameError, iter_frames
from schemas.shard_table import encode_manifest
from schemas.tfds_metadata import OUR_KEYS, tfds_metadata_files
from tfrecord_io import source as _source

__all__ = ["adopt", "main"]

_SPLIT_RE = re.compile(r"^(?P<split>[a-z][a-z0-9_]*)-\d+-of-\d+(\.[A-Za-z0-9]+)?$")
_NOT_SHARDS = (".idx", ".json", ".jsonl", ".parquet", ".txt")


@dataclasses.dataclass
class _Split:
    shards: list[ShardInfo] = dataclasses.field(default_factory=list)
    columns: dict[str, list[Any]] = dataclasses.field(default_factory=dict)

    def add(self, name: str, value: Any) -> None:
        self.columns.setdefault(name, []).append(value)


def _split_of(name: str, default: str) -> str:
    match = _SPLIT_RE.match(name)
    return match["split"] if match else default


def _label_names(records: dict[int, tuple[str | None, str | None]], num_labels: int) -> list[str]:
    names = []
    for label in range(num_labels):
        synset, text = records.get(label, (None, None))
        names.append(synset or text or f"class_{label}")
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    # Names must be distinct: a repeated one gets its label appended.
    return [f"{n} ({i})" if counts[n] > 1 else n for i, n in enumerate(names)]


def _write(path: str, data: bytes) -> None:
    """Writes a file under a temporary name, then renames it (a single PUT on object stores)."""
    storage_for(path).write_bytes(path, data)


def _parent(path: str) -> str:
    return posixpath.dirname(path) if _source.is_remote(path) else os.path.dirname(path)


@dataclasses.dataclass
class _Scan:
    """What one pass over the shards found: per split its shards and catalog columns, each
    shard's index file, and what the manifest says of the whole (classes, image sizes and
    formats, the feature keys every example has)."""

    label_offset: int
    default_split: str
    splits: dict[str, _Split] = dataclasses.field(default_factory=dict)
    index_files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    names: dict[int, tuple[str | None, str | None]] = dataclasses.field(default_factory=dict)
    common_keys: frozenset[str] | None = None
    shorter_sides: list[int] = dataclasses.field(default_factory=list)
    formats: dict[str, int] = dataclasses.field(default_factory=dict)
    max_label: int = -1

    def add_shard(self, path: str) -> None:
        """Reads one shard: every record's catalog row, the index file and the shard's entry.

        Raises:
          FrameError: for a damaged record (naming the shard and the byte offset).
          ValueError: for a record that is not an Example with an image, or a bad label.
        """
        name = posixpath.basename(path) if _source.is_remote(path) else os.path.basename(path)
        split_name = _split_of(name, self.default_split)
        target = self.splits.setdefault(split_name, _Split())
        entries = []
        digest: list[tuple[int, str]] = []
        with _source.open_binary(path) as stream:
            for number, frame in enumerate(iter_frames(stream, name=path, digest=digest)):
                record = parse_foreign(
                    frame.payload, label_offset=self.label_offset, where=f"{path} record {number}"
                )
                entries.append((frame.offset, frame.length))
                self._note(record)
                for column, value in (
                    ("key", record.key),
                    ("uri", record.uri),
                    ("label", record.label),
                    ("text", record.text),
                    ("split", split_name),
                    ("shard", name),
                    ("record", number),
                    ("offset", frame.offset),
                    ("length", frame.length),
                    ("height", record.height),
                    ("width", record.width),
                    ("format", record.format),
                ):
                    target.add(column, value)
        num_bytes, sha256 = digest[0]
        index_name = index_filename(name)
        index = self.index_files[index_name] = format_index(entries)
        target.shards.append(
            ShardInfo(
                file=name,
                num_examples=len(entries),
                num_bytes=num_bytes,
                sha256=sha256,
                index=FileInfo(index_name, len(index), hashlib.sha256(index).hexdigest()),
            )
        )

    def _note(self, record: ForeignRecord) -> None:
        """Adds what the manifest needs of one record."""
        keys = self.common_keys
        self.common_keys = record.keys if keys is None else keys & record.keys
        if record.label is not None:
            self.max_label = max(self.max_label, record.label)
            self.names.setdefault(record.label, (record.synset, record.text))
        if record.height and record.width:
            self.shorter_sides.append(min(record.height, record.width))
        if record.format:
            self.formats[record.format] = self.formats.get(record.format, 0) + 1

    def split_infos(self) -> tuple[dict[str, SplitInfo], dict[str, bytes]]:
        """Each split's entry in ``dataset.json``, and its catalog's bytes by file name."""
        split_infos = {}
        catalogs: dict[str, bytes] = {}
        for split_name, target in sorted(self.splits.items()):
            count = sum(s.num_examples for s in target.shards)
            target.columns.setdefault("key", [])
            columns = {k: v for k, v in target.columns.items()}
            columns["index"] = list(range(count))
            for column in ("split", "shard", "record", "offset", "length"):
                columns.setdefault(column, [])
            data = catalogs[catalog_filename(split_name)] = table_bytes(build_table(columns))
            split_infos[split_name] = SplitInfo(
                num_examples=count,
                shards=tuple(target.shards),
                catalog=FileInfo(
                    catalog_filename(split_name), len(data), hashlib.sha256(data).hexdigest()
                ),
            )
        return split_infos, catalogs

    def manifest(
        self, split_infos: dict[str, SplitInfo], *, pattern: str, shard_root: str | None
    ) -> Manifest:
        """The ``dataset.json`` that describes the shards scanned."""
        total = sum(s.num_examples for s in split_infos.values())
        formats = self.formats
        encoding = "png" if formats and max(formats, key=lambda f: formats[f]) == "PNG" else "jpeg"
        return Manifest(
            label_names=tuple(_label_names(self.names, self.max_label + 1)),
            splits=split_infos,
            counts=Counts(input=total, written=total, rejected=0, duplicates=0),
            image=ImageSpec(
                encoding=encoding, image_size=max(self.shorter_sides, default=1), crop="none"
            ),
            options={
                ADOPTED_OPTION: {
                    "pattern": pattern,
                    "label_offset": self.label_offset,
                    "key": "image/key/sha256, else the SHA-256 of image/encoded",
                }
            },
            shard_root=shard_root,
        )


def _shard_paths(pattern: str, split: str) -> tuple[list[str], str]:
    """The shards ``pattern`` matches, and the one directory that holds them.

    Raises:
      FileNotFoundError: if nothing matches ``pattern``.
      ValueError: if ``pattern`` is a dataset already, or matches shards in several directories.
    """
    resolved = _source.resolve_source(pattern, split)
    if resolved.manifest is not None:
        raise ValueError(f"{pattern} is already a dataset (it has {MANIFEST_NAME})")
    # A glob like 'DIR/train-*' also matches what an earlier adoption wrote next to the shards.
    paths = [p for p in resolved.paths if not p.endswith(_NOT_SHARDS)]
    if not paths:
        raise FileNotFoundError(f"{pattern} matches no TFRecord shards")
    directories = {_parent(p) for p in paths}
    if len(directories) != 1:
        raise ValueError(
            f"{pattern} matches shards in {len(directories)} directories; adopt one directory "
            "at a time (a glob like 'DIR/train-*')"
        )
    return paths, directories.pop() or "."


def adopt(
    pattern: str,
    *,
    output: str | None = None,
    label_offset: int = 0,
    split: str = "train",
    overwrite: bool = False,
) -> Manifest:
    """Scans foreign shards once and writes ``dataset.json``, index files, catalogs, tfds metadata.

    Args:
      pattern: a glob (or one file) of TFRecord shards, local or URI, all in one directory.
      output: where to write (default: the shards' directory). The shards are never rewritten.
      label_offset: subtracted from every stored label (1 for TensorFlow's converters).
      split: the split of shards whose names do not start with ``<split>-NNNNN-of-NNNNN``.
      overwrite: replace an existing ``dataset.json`` in ``output``.

    Returns:
      The manifest written.

    Raises:
      FileNotFoundError: if nothing matches ``pattern``.
      FileExistsError: if ``output`` holds ``dataset.json`` and ``overwrite`` is False.
      ValueError: for a damaged shard or record (naming it and the byte offset), shards in
        several directories, or a bad ``label_offset``.
    """
    if label_offset < 0:
        raise ValueError(f"--label_offset must be >= 0, got {label_offset}")
    paths, shard_dir = _shard_paths(pattern, split)
    root = output.rstrip("/") if output else shard_dir
    manifest_path = _source.join(root, MANIFEST_NAME)
    if _source.exists(manifest_path) and not overwrite:
        raise FileExistsError(
            f"{manifest_path} already exists; pass --overwrite to replace it, or choose another "
            "--output"
        )
    scan = _Scan(label_offset=label_offset, default_split=split)
    for path in paths:
        scan.add_shard(path)
    split_infos, catalogs = scan.split_infos()
    manifest = scan.manifest(
        split_infos,
        pattern=pattern,
        shard_root=None if _same_place(root, shard_dir) else shard_dir,
    )
    for name, data in sorted(scan.index_files.items()):
        _write(_source.join(root, name), data)
    for name, data in sorted(catalogs.items()):
        _write(_source.join(root, name), data)
    if manifest.shard_root is None:
        _write_tfds_metadata(root, manifest, scan.common_keys, label_offset=label_offset)
    # dataset.json last: a dataset is only there once everything it lists is (its shard
    # tables included).
    text, tables = encode_manifest(manifest)
    for name, data in sorted(tables.items()):
        _write(_source.join(root, name), data)
    _write(manifest_path, text.encode("utf-8"))
    return manifest


def _write_tfds_metadata(
    root: str, manifest: Manifest, common_keys: frozenset[str] | None, *, label_offset: int
) -> None:
    """Writes tfds' metadata files next to the shards, so tfds can read them where they are."""
    keys = [k for k in OUR_KEYS if common_keys and k in common_keys]
    try:
        tfds_files = tfds_metadata_files(
            manifest, keys=keys, class_label=label_offset == 0 and KEY_LABEL in keys
        )
    except ValueError:
        tfds_files = {}  # names tfds has no template for: the other tools still work
    for name, text in sorted(tfds_files.items()):
        _write(_source.join(root, name), text.encode("utf-8"))


def _same_place(a: str, b: str) -> bool:
    if _source.is_remote(a) or _source.is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(_source.local_path(a)) == os.path.realpath(_source.local_path(b))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (``dataset_tools.command.run_tool``)."""
    return run_tool(lambda: _main(argv), unfinished="dataset.json was not written")


def _main(argv: Sequence[str] | None) -> int:
    parser = tool_parser(
        "dataset_tools.adopt",
        (
            "Describe existing TFRecord shards (e.g. TensorFlow's ImageNet converter output) "
            "with dataset.json, index files and a catalog, without rewriting them."
        ),
    )
    parser.add_argument("pattern", help="glob of the shards, e.g. 'imagenet/train-*' (quoted)")
    parser.add_argument(
        "--label_offset",
        type=int,
        default=0,
        help="subtracted from stored labels: 1 for TensorFlow's converters (1-based labels)",
    )
    parser.add_argument("--output", help="where to write (default: next to the shards)")
    parser.add_argument(
        "--split", default="train", help="split of shards not named <split>-NNNNN-of-NNNNN"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset.json")
    args = parse_tool_args(parser, argv)
    try:
        manifest = adopt(
            args.pattern,
            output=args.output,
            label_offset=args.label_offset,
            split=args.split,
            overwrite=args.overwrite,
        )
    except FrameError as e:
        print(f"error: damaged shard: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    root = args.output or "the shards' directory"
    for name, split in sorted(manifest.splits.items()):
        shards = plural(len(split.shards), "shard")
        print(f"{name}: {plural(split.num_examples, 'example')} in {shards}")
    print(f"classes: {len(manifest.label_names)}")
    print(f"adopted: dataset.json, index files and catalogs written to {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
