"""Compares two versions of a dataset from their manifests and catalogs alone, never their shards.

``python -m dataset_tools.diff OLD NEW [--json] [--limit N] [--fail_on_change]``

Examples are matched by key (the SHA-256 of the source bytes). Every example of either version
is exactly one of:

* ``added``: its key is only in NEW;
* ``removed``: its key is only in OLD;
* ``unchanged``: in both, and its stored example is the same;
* ``changed``: in both, with one or more of these differences (an example may have several):
  ``moved`` (another split), ``relabelled`` (another class name), ``renumbered`` (same class
  name, another label index: the label set changed), ``renamed`` (another source URI) and
  ``reencoded`` (same source, different stored image: format, dimensions or image size differ).

The catalog holds no hash of the stored image, so ``reencoded`` is found from the stored
format, height, width and image byte count (the frame length minus what the example's other
fields take, computed exactly). Two encodings of one image with equal size and dimensions
(RAW pixels from another resampler) look alike: ``image_options_differ`` says when the options
that decide the stored pixels differ, which is when such changes can happen.

Counts are given per split (the NEW split, or the OLD one for removed examples; ``moved`` is
split into ``moved_out`` of the OLD split and ``moved_in`` to the NEW one) and per class name
(likewise, with ``relabelled_out`` / ``relabelled_in``). Sources may be local paths or bucket
URIs, a dataset root, its ``dataset.json``, or a versions root holding a ``latest`` pointer.
Exit status: 0 when the comparison ran (whatever it found), 1 with ``--fail_on_change`` when
anything differs, 2 when a dataset cannot be read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.keys import key_prefixes
from catalog.table import catalog_filename, read_table
from cliflags import plural
from dataset_tools.command import parse_tool_args, run_tool, tool_parser
from schemas import (
    KEY_CHANNELS,
    KEY_ENCODED,
    KEY_FILENAME,
    KEY_FORMAT,
    KEY_HEIGHT,
    KEY_LABEL,
    KEY_SHA256,
    KEY_TEXT,
    KEY_WIDTH,
    Manifest,
)
from schemas.framing import FRAME_OVERHEAD
from schemas.lineage import describe_option_changes, image_options
from tfrecord_io.source import join, manifest_path, read_bytes, read_manifest_file

__all__ = [
    "FLAGS",
    "KINDS",
    "DatasetCatalog",
    "DiffReport",
    "load_catalog",
    "diff_catalogs",
    "diff_datasets",
    "full_join",
    "example_frame_lengths",
    "stored_image_bytes",
    "main",
]

# Differences an example present in both versions may have (several at once).
FLAGS = ("moved", "relabelled", "renumbered", "renamed", "reencoded")
# Exactly one of these holds for every example of either version.
KINDS = ("added", "removed", "unchanged", "changed")
_COLUMNS = ("key", "uri", "label", "text", "split", "length", "height", "width", "format")
# Catalog columns with few distinct values, compared and grouped as dictionary indices.
_CODED = ("split", "text", "format")


@dataclasses.dataclass(frozen=True)
class DatasetCatalog:
    """One version: where it lives, its manifest and the catalog rows of every split.

    Attributes:
      source: the source as given.
      root: the dataset directory it resolved to (after a ``latest`` pointer).
      manifest: the parsed ``dataset.json``.
      manifest_sha256: SHA-256 of the ``dataset.json`` bytes.
      rows: the catalog columns ``diff`` needs, every split concatenated.
    """

    source: str
    root: str
    manifest: Manifest
    manifest_sha256: str
    rows: pa.Table


def _catalog_entries(manifest: Manifest, split: str) -> list[dict[str, Any]]:
    """The split's catalog files as ``dataset.json`` lists them (file, size, hash), in order:
    one, or its partitions; or, if it lists none, the usual single file's name."""
    listed = manifest.split(split).catalog_files
    if not listed:
        return [{"file": catalog_filename(split)}]
    return [{"file": f.file, "num_bytes": f.num_bytes, "sha256": f.sha256} for f in listed]


def _read_catalog_file(root: str, split: str, entry: dict[str, Any]) -> pa.Table:
    """One catalog file's ``_COLUMNS``, after checking it against what ``dataset.json`` lists."""
    where = join(root, entry["file"])
    try:
        blob = read_bytes(where)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{where} does not exist: the dataset has no catalog for split {split!r} "
            "(datasets built before catalogs existed cannot be diffed; rebuild them)"
        ) from e
    if "num_bytes" in entry and len(blob) != entry["num_bytes"]:
        raise ValueError(
            f"{where}: {len(blob)} bytes, dataset.json says {entry['num_bytes']}: the "
            "catalog was changed or truncated after publishing"
        )
    if "sha256" in entry and hashlib.sha256(blob).hexdigest() != entry["sha256"]:
        raise ValueError(f"{where}: SHA-256 differs from dataset.json; the catalog is damaged")
    return read_table(pa.BufferReader(blob), columns=_COLUMNS, name=where)


def load_catalog(source: str | os.PathLike[str]) -> DatasetCatalog:
    """Reads a dataset's manifest and catalogs (local or bucket), checking what they list.

    Raises:
      FileNotFoundError: if the source is not a dataset, or a catalog is missing (naming it).
      ValueError: if the manifest or a catalog is invalid, or a catalog's size or SHA-256
        differs from what ``dataset.json`` lists.
    """
    text = os.fspath(source)
    path = manifest_path(text)
    if path is None:
        raise FileNotFoundError(
            f"{text} is not a dataset: diff needs a directory (or URI) holding dataset.json, "
            "or a versions root holding a 'latest' pointer"
        )
    data = read_bytes(path)
    # Diff reads no shard entries: a shard table (format version 2) is never loaded.
    manifest = read_manifest_file(path, data)
    root = path[: -len("dataset.json")].rstrip("/") or "."
    tables = []
    for split in sorted(manifest.splits):
        entries = _catalog_entries(manifest, split)
        # A partitioned catalog's files, read one at a time, in order.
        parts = [_read_catalog_file(root, split, entry) for entry in entries]
        rows = sum(t.num_rows for t in parts)
        expected = manifest.split(split).num_examples
        if rows != expected:
            where = join(root, entries[0]["file"]) if len(entries) == 1 else f"catalog of {split!r}"
            raise ValueError(
                f"{where}: {rows} rows, dataset.json says split {split!r} holds {expected} examples"
            )
        tables.extend(parts)
    rows = pa.concat_tables(tables) if tables else pa.table({c: [] for c in _COLUMNS})
    return DatasetCatalog(text, root, manifest, hashlib.sha256(data).hexdigest(), rows)


# --- the stored image's byte count, from the frame length --------------------------------------


_VARINT_LIMITS = np.array([1 << bits for bits in range(7, 64, 7)], np.uint64)


def _varint_len(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's varint (non-negative values)."""
    limits = _VARINT_LIMITS
    return np.searchsorted(limits, np.asarray(values).astype(np.uint64), side="right") + 1


def _entry(key: str, feature_len: np.ndarray) -> np.ndarray:
    """Bytes a map entry ``key -> Feature`` takes inside ``Features`` (tag and length included)."""
    k = len(key.encode("utf-8"))
    entry = 1 + 1 + k + 1 + _varint_len(feature_len) + feature_len
    return 1 + _varint_len(entry) + entry


def _bytes_feature(value_len: np.ndarray) -> np.ndarray:
    inner = 1 + _varint_len(value_len) + value_len  # BytesList with one value
    return 1 + _varint_len(inner) + inner


def _int_feature(value: np.ndarray) -> np.ndarray:
    packed = _varint_len(value)
    inner = 1 + _varint_len(packed) + packed  # Int64List, packed, one value
    return 1 + _varint_len(inner) + inner


def _example_len(image_len: np.ndarray, others: np.ndarray) -> np.ndarray:
    features = others + _entry(KEY_ENCODED, _bytes_feature(image_len))
    return 1 + _varint_len(features) + features


def _other_fields(
    format_len: np.ndarray,
    text_len: np.ndarray,
    uri_len: np.ndarray,
    label: np.ndarray,
    height: np.ndarray,
    width: np.ndarray,
) -> np.ndarray:
    ones = np.ones_like(np.asarray(label, np.int64))
    return (
        _entry(KEY_FORMAT, _bytes_feature(np.asarray(format_len, np.int64)))
        + _entry(KEY_TEXT, _bytes_feature(np.asarray(text_len, np.int64)))
        + _entry(KEY_FILENAME, _bytes_feature(np.asarray(uri_len, np.int64)))
        + _entry(KEY_SHA256, _bytes_feature(64 * ones))
        + _entry(KEY_LABEL, _int_feature(np.asarray(label, np.int64)))
        + _entry(KEY_HEIGHT, _int_feature(np.asarray(height, np.int64)))
        + _entry(KEY_WIDTH, _int_feature(np.asarray(width, np.int64)))
        + _entry(KEY_CHANNELS, _int_feature(ones))  # 1 or 3: one byte either way
    )


def example_frame_lengths(image_len: np.ndarray, **fields: np.ndarray) -> np.ndarray:
    """The TFRecord frame length of examples of our layout (the inverse of
    ``stored_image_bytes``); ``fields`` as there."""
    others = _other_fields(**fields)
    return _example_len(np.asarray(image_len, np.int64), others) + FRAME_OVERHEAD


def stored_image_bytes(length: np.ndarray, **fields: np.ndarray) -> np.ndarray:
    """The byte count of each example's ``image/encoded`` value, from its catalog row.

    Inverts the size of the deterministic serialisation of our layout: the frame ``length``
    less what the other fields take.

    Args:
      length: the frame lengths (catalog ``length``).
      fields: ``format_len``, ``text_len``, ``uri_len`` (UTF-8 bytes of the format, class text
        and file name), ``label``, ``height``, ``width``.

    Returns:
      int64 array; -1 where no image size gives ``length`` (a frame not of our layout).
    """
    length = np.asarray(length, np.int64)
    others = _other_fields(**fields)
    target = length - FRAME_OVERHEAD
    guess = np.maximum(target - others - 8, 0)
    for _ in range(4):  # the overhead is a step function of the size: settles in two rounds
        guess = np.maximum(guess + target - _example_len(guess, others), 0)
    return np.where(_example_len(guess, others) == target, guess, -1)


# --- the comparison ---------------------------------------------------------------------------


def _plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The values of a dictionary-encoded column (or the column itself)."""
    if pa.types.is_dictionary(column.type):
        return pc.cast(column, column.type.value_type)
    return column


def _comparable(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """What to compare: a dictionary column's indices (``full_join`` gives both sides of a
    column one dictionary), or the column itself."""
    if pa.types.is_dictionary(column.type):
        return pa.chunked_array([chunk.indices for chunk in column.chunks], column.type.index_type)
    return column


def _not_equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """Element-wise ``a != b`` where null equals null and differs from any value."""
    a, b = _comparable(a), _comparable(b)
    differ = pc.fill_null(pc.not_equal(a, b), False)
    one_null = pc.not_equal(pc.is_null(a), pc.is_null(b))
    return np.asarray(pc.or_(differ, one_null))


def _image_bytes(joined: pa.Table, side: str) -> np.ndarray:
    def col(name: str) -> pa.ChunkedArray:
        return joined.column(f"{name}_{side}")

    def ints(name: str) -> np.ndarray:
        return np.asarray(pc.fill_null(col(name), 0), np.int64)

    def utf8_len(name: str) -> np.ndarray:
        return np.asarray(pc.fill_null(pc.binary_length(_plain(col(name))), 0), np.int64)

    return stored_image_bytes(
        ints("length"),
        format_len=utf8_len("format"),
        text_len=utf8_len("text"),
        uri_len=utf8_len("uri"),
        label=ints("label"),
        height=ints("height"),
        width=ints("width"),
    )


@dataclasses.dataclass
class DiffReport:
    """What differs between two versions.

    Attributes:
      old, new: the sources compared and what they resolved to.
      image_options_differ: whether the options that decide stored pixels differ.
      image_option_changes: ``"image_size 256 -> 224"``-style text, empty when equal.
      label_names: ``{"added": [...], "removed": [...], "renumbered": bool}``.
      totals: example counts per kind and per flag, and ``old`` / ``new`` sizes.
      splits: per split, the counts (see the module doc).
      classes: per class name, the counts.
      moves: ``"train -> validation": count``.
      relabels: ``"cat -> dog": count``.
      examples: up to ``limit`` examples per kind and flag (smallest keys first).
    """

    old: dict[str, Any]
    new: dict[str, Any]
    image_options_differ: bool
    image_option_changes: str
    label_names: dict[str, Any]
    totals: dict[str, int]
    splits: dict[str, dict[str, int]]
    classes: dict[str, dict[str, int]]
    moves: dict[str, int]
    relabels: dict[str, int]
    examples: dict[str, list[dict[str, Any]]]

    @property
    def changed(self) -> bool:
        """True when anything differs (examples, image options or label names)."""
        t = self.totals
        return bool(
            t["added"]
            or t["removed"]
            or t["changed"]
            or self.image_options_differ
            or self.label_names["added"]
            or self.label_names["removed"]
            or self.label_names["renumbered"]
        )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "changed": self.changed}


def _grouped(groups: pa.ChunkedArray, masks: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """Per group value, the number of rows where each mask holds (groups with no row left out)."""
    combined = groups.combine_chunks()
    encoded = combined if pa.types.is_dictionary(combined.type) else pc.dictionary_encode(combined)
    names = encoded.dictionary.to_pylist()
    codes = np.asarray(pc.fill_null(encoded.indices, -1))
    valid = codes >= 0
    out: dict[str, dict[str, int]] = {}
    counts = {
        kind: np.bincount(codes[valid & mask], minlength=len(names)) for kind, mask in masks.items()
    }
    for i, name in enumerate(names):
        row = {kind: int(c[i]) for kind, c in counts.items()}
        if any(row.values()):
            out[name] = row
    return dict(sorted(out.items()))


def _pairs(old: pa.ChunkedArray, new: pa.ChunkedArray, mask: np.ndarray) -> dict[str, int]:
    if not mask.any():
        return {}
    chosen = pa.table({"old": _plain(old), "new": _plain(new)}).filter(pa.array(mask))
    counted = chosen.group_by(["old", "new"]).aggregate([([], "count_all")])
    pairs = {
        f"{o} -> {n}": int(c)
        for o, n, c in zip(
            counted.column("old").to_pylist(),
            counted.column("new").to_pylist(),
            counted.column("count_all").to_pylist(),
            strict=True,
        )
    }
    return dict(sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0])))


def _samples(
    joined: pa.Table, mask: np.ndarray, limit: int, keys: tuple[pa.ChunkedArray, pa.ChunkedArray]
) -> list[dict[str, Any]]:
    if limit <= 0 or not mask.any():
        return []
    chosen = joined.filter(pa.array(mask))
    key = pc.coalesce(
        keys[0].take(chosen.column("row_old")), keys[1].take(chosen.column("row_new"))
    )
    chosen = chosen.append_column("key", key)
    if chosen.num_rows > limit:
        chosen = chosen.take(pc.select_k_unstable(chosen, limit, [("key", "ascending")]))
    chosen = chosen.sort_by("key")
    out = []
    for row in chosen.to_pylist():
        sample: dict[str, Any] = {"key": row["key"]}
        for name in ("split", "text", "label", "uri"):
            old, new = row[f"{name}_old"], row[f"{name}_new"]
            sample[name] = new if old == new or old is None else old if new is None else [old, new]
        out.append(sample)
    return out


def _match(old: pa.Table, new: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Row pairs with equal keys: ``(old rows, new rows)``.

    Keys are SHA-256 hex digests, so their first 64 bits almost never collide: rows are matched
    on them with a sort, and every match is then checked on the whole key. Anything else (keys
    that are not hex digests, colliding prefixes) goes through Arrow's hash join.
    """
    a, b = key_prefixes(old.column("key")), key_prefixes(new.column("key"))
    if a is not None and b is not None:
        order = np.argsort(a, kind="stable")
        sorted_a = a[order]
        sorted_b = np.sort(b)
        unique = (
            not (sorted_a[1:] == sorted_a[:-1]).any() and not (sorted_b[1:] == sorted_b[:-1]).any()
        )
        if unique:
            at = np.minimum(np.searchsorted(sorted_a, b), max(len(a) - 1, 0))
            found = (sorted_a[at] == b) if len(a) else np.zeros(len(b), bool)
            i_new = np.flatnonzero(found)
            i_old = order[at[found]]
            same = pc.equal(old.column("key").take(i_old), new.column("key").take(i_new))
            if pc.all(same).as_py() in (True, None):
                return i_old, i_new
    left = pa.table({"key": old.column("key"), "i_old": np.arange(old.num_rows)})
    right = pa.table({"key": new.column("key"), "i_new": np.arange(new.num_rows)})
    pairs = left.join(right, keys="key", join_type="inner")
    return np.asarray(pairs.column("i_old")), np.asarray(pairs.column("i_new"))


def full_join(old: pa.Table, new: pa.Table) -> pa.Table:
    """One row per key of either table: matched rows first, then OLD's only, then NEW's only.

    Columns are ``row_old`` and ``row_new`` (the row on each side) and every column but ``key``
    twice, ``<name>_old`` and ``<name>_new``, null where the key is absent from that side. The
    columns of few values (``_CODED``) are dictionary-encoded with one dictionary for both
    sides: moving their indices costs a tenth of moving their strings.
    """
    i_old, i_new = _match(old, new)
    only_old = np.setdiff1d(np.arange(old.num_rows), i_old, assume_unique=True)
    only_new = np.setdiff1d(np.arange(new.num_rows), i_new, assume_unique=True)
    n_old, n_new = len(only_old), len(only_new)
    take_old = pa.array(
        np.concatenate([i_old, only_old, np.zeros(n_new, np.int64)]),
        mask=np.concatenate([np.zeros(len(i_old) + n_old, bool), np.ones(n_new, bool)]),
    )
    take_new = pa.array(
        np.concatenate([i_new, np.zeros(n_old, np.int64), only_new]),
        mask=np.concatenate(
            [np.zeros(len(i_new), bool), np.ones(n_old, bool), np.zeros(n_new, bool)]
        ),
    )
    columns: dict[str, Any] = {"row_old": take_old, "row_new": take_new}
    for name in old.column_names:
        if name == "key":
            continue
        if name in _CODED and old.num_rows and new.num_rows:
            both = pa.chunked_array(old.column(name).chunks + new.column(name).chunks)
            encoded = pc.dictionary_encode(both)
            dictionary = encoded.chunks[0].dictionary
            indices = pa.chunked_array([c.indices for c in encoded.chunks]).combine_chunks()
            for side, rows, start, count in (
                ("old", take_old, 0, old.num_rows),
                ("new", take_new, old.num_rows, new.num_rows),
            ):
                taken = indices.slice(start, count).take(rows)
                columns[f"{name}_{side}"] = pa.DictionaryArray.from_arrays(taken, dictionary)
        else:
            columns[f"{name}_old"] = old.column(name).take(take_old)
            columns[f"{name}_new"] = new.column(name).take(take_new)
    return pa.table(columns)


def diff_catalogs(old: DatasetCatalog, new: DatasetCatalog, *, limit: int = 10) -> DiffReport:
    """Compares two loaded versions.

    Args:
      old, new: the versions, from ``load_catalog``.
      limit: examples listed per kind and flag.

    Raises:
      ValueError: if ``limit`` is negative.
    """
    if limit < 0:
        raise ValueError(f"--limit must be >= 0, got {limit!r}")
    joined = full_join(old.rows, new.rows)
    in_old = np.asarray(pc.is_valid(joined.column("split_old")))
    in_new = np.asarray(pc.is_valid(joined.column("split_new")))
    both = in_old & in_new
    flags = _flags(joined, both)
    changed = np.logical_or.reduce(list(flags.values())) if len(joined) else both
    kinds = {
        "added": in_new & ~in_old,
        "removed": in_old & ~in_new,
        "unchanged": both & ~changed,
        "changed": changed,
    }
    totals = {name: int(mask.sum()) for name, mask in {**kinds, **flags}.items()}
    totals["old"] = int(in_old.sum())
    totals["new"] = int(in_new.sum())
    splits, classes = _split_and_class_counts(joined, in_old, in_new, kinds, flags)
    old_opts = image_options(old.manifest.options, tool_version=old.manifest.tool_version)
    new_opts = image_options(new.manifest.options, tool_version=new.manifest.tool_version)
    old_names, new_names = old.manifest.label_names, new.manifest.label_names
    return DiffReport(
        old=_describe(old),
        new=_describe(new),
        image_options_differ=old_opts != new_opts,
        image_option_changes=describe_option_changes(old_opts, new_opts),
        label_names={
            "added": sorted(set(new_names) - set(old_names)),
            "removed": sorted(set(old_names) - set(new_names)),
            "renumbered": any(
                old_names.index(n) != new_names.index(n) for n in set(old_names) & set(new_names)
            ),
        },
        totals=totals,
        splits=splits,
        classes=classes,
        moves=_pairs(joined.column("split_old"), joined.column("split_new"), flags["moved"]),
        relabels=_pairs(joined.column("text_old"), joined.column("text_new"), flags["relabelled"]),
        examples={
            name: _samples(joined, mask, limit, (old.rows.column("key"), new.rows.column("key")))
            for name, mask in {**kinds, **flags}.items()
            if name != "unchanged"
        },
    )


def _flags(joined: pa.Table, both: np.ndarray) -> dict[str, np.ndarray]:
    """Per flag (``FLAGS``, in that order), which rows of ``full_join`` have that difference.

    Args:
      joined: the two versions' rows, from ``full_join``.
      both: the rows whose key is in both versions.
    """

    def differs(name: str) -> np.ndarray:
        return both & _not_equal(joined.column(f"{name}_old"), joined.column(f"{name}_new"))

    flags = {
        "moved": differs("split"),
        "relabelled": differs("text"),
        "renamed": differs("uri"),
    }
    flags["renumbered"] = differs("label") & ~flags["relabelled"]
    # The image size can differ only where the frame length or another field's size differs.
    maybe = np.flatnonzero(
        differs("length") | flags["relabelled"] | flags["renamed"] | flags["renumbered"]
    )
    old_image = np.zeros(len(joined), np.int64)
    new_image = np.zeros(len(joined), np.int64)
    if len(maybe):
        subset = joined.take(maybe)
        old_image[maybe] = _image_bytes(subset, "old")
        new_image[maybe] = _image_bytes(subset, "new")
    # A frame not of our layout (adopted shards) gives -1: then only its whole length is
    # compared, and only where no other field that takes bytes changed.
    unknown = (old_image < 0) | (new_image < 0)
    other_fields = flags["relabelled"] | flags["renamed"] | flags["renumbered"]
    size_differs = np.where(
        unknown, differs("length") & ~other_fields, both & (old_image != new_image)
    )
    flags["reencoded"] = differs("format") | differs("height") | differs("width") | size_differs
    return {name: flags[name] for name in FLAGS}


def _split_and_class_counts(
    joined: pa.Table,
    in_old: np.ndarray,
    in_new: np.ndarray,
    kinds: Mapping[str, np.ndarray],
    flags: Mapping[str, np.ndarray],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """The counts per split and per class name (see the module docstring for which side)."""
    on_new = {"new": in_new, "added": kinds["added"]}
    on_new.update({n: flags[n] for n in ("renumbered", "renamed", "reencoded")})
    on_new.update(changed=kinds["changed"], unchanged=kinds["unchanged"])
    on_old = {"old": in_old, "removed": kinds["removed"]}
    splits = _counts_by(
        _SPLIT_COLUMNS,
        (joined.column("split_new"), {**on_new, "moved_in": flags["moved"]}),
        (joined.column("split_old"), {**on_old, "moved_out": flags["moved"]}),
        (joined.column("split_new"), {"relabelled": flags["relabelled"]}),
    )
    classes = _counts_by(
        _CLASS_COLUMNS,
        (joined.column("text_new"), {**on_new, "relabelled_in": flags["relabelled"]}),
        (joined.column("text_old"), {**on_old, "relabelled_out": flags["relabelled"]}),
        (joined.column("text_new"), {"moved": flags["moved"]}),
    )
    return splits, classes


_SPLIT_COLUMNS = (
    "old",
    "new",
    "added",
    "removed",
    "moved_in",
    "moved_out",
    "relabelled",
    "renumbered",
    "renamed",
    "reencoded",
    "changed",
    "unchanged",
)
_CLASS_COLUMNS = (
    "old",
    "new",
    "added",
    "removed",
    "relabelled_in",
    "relabelled_out",
    "renumbered",
    "moved",
    "renamed",
    "reencoded",
    "changed",
    "unchanged",
)


def _counts_by(
    columns: Sequence[str], *groupings: tuple[pa.ChunkedArray, Mapping[str, np.ndarray]]
) -> dict[str, dict[str, int]]:
    """Per group, every column's count (0 when absent), groups in name order."""
    out: dict[str, dict[str, int]] = {}
    for groups, masks in groupings:
        for group, row in _grouped(groups, masks).items():
            out.setdefault(group, {}).update(row)
    return {group: {c: row.get(c, 0) for c in columns} for group, row in sorted(out.items())}


def _describe(side: DatasetCatalog) -> dict[str, Any]:
    return {
        "source": side.source,
        "root": side.root,
        "manifest_sha256": side.manifest_sha256,
        "num_examples": side.rows.num_rows,
        "splits": {n: s.num_examples for n, s in sorted(side.manifest.splits.items())},
    }


def diff_datasets(
    old: str | os.PathLike[str], new: str | os.PathLike[str], *, limit: int = 10
) -> DiffReport:
    """Loads two versions (``load_catalog``) and compares them (``diff_catalogs``)."""
    return diff_catalogs(load_catalog(old), load_catalog(new), limit=limit)


# --- the command line -------------------------------------------------------------------------


def _table(title: str, rows: Mapping[str, Mapping[str, int]]) -> list[str]:
    if not rows:
        return [f"{title}: none"]
    columns = list(next(iter(rows.values())))
    width = max(len(title), *(len(name) for name in rows))
    head = f"{title:<{width}}  " + "  ".join(f"{c:>{max(len(c), 7)}}" for c in columns)
    lines = [head]
    for name, row in rows.items():
        cells = "  ".join(f"{row[c]:>{max(len(c), 7)}}" for c in columns)
        lines.append(f"{name:<{width}}  {cells}")
    return lines


def _print_human(report: DiffReport) -> None:
    t = report.totals
    for side, info in (("OLD", report.old), ("NEW", report.new)):
        print(
            f"{side} {info['root']}: {plural(info['num_examples'], 'example')} "
            f"(dataset.json sha256 {info['manifest_sha256'][:12]})"
        )
    options = (
        f"differ ({report.image_option_changes})" if report.image_options_differ else "the same"
    )
    print(f"image options: {options}")
    names = report.label_names
    if names["added"] or names["removed"] or names["renumbered"]:
        print(
            f"label names: added {names['added']}, removed {names['removed']}"
            + (", indexes renumbered" if names["renumbered"] else "")
        )
    else:
        print("label names: the same")
    print(
        f"added {t['added']}  removed {t['removed']}  changed {t['changed']}  unchanged "
        f"{t['unchanged']}  (moved {t['moved']}, relabelled {t['relabelled']}, renumbered "
        f"{t['renumbered']}, renamed {t['renamed']}, reencoded {t['reencoded']})"
    )
    print()
    print("\n".join(_table("split", report.splits)))
    print()
    print("\n".join(_table("class", report.classes)))
    for title, pairs in (("moves", report.moves), ("relabels", report.relabels)):
        if pairs:
            print(f"\n{title}: " + ", ".join(f"{k} ({v})" for k, v in pairs.items()))
    for kind, samples in report.examples.items():
        if samples:
            print(f"\n{kind} (first {len(samples)} of {t[kind]} by key):")
            for s in samples:
                fields = "  ".join(
                    f"{n}={'->'.join(map(str, s[n])) if isinstance(s[n], list) else s[n]}"
                    for n in ("split", "text", "uri")
                )
                print(f"  {s['key'][:16]}  {fields}")
    print(f"\n{'CHANGED' if report.changed else 'NO CHANGE'}")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (``dataset_tools.command.run_tool``)."""
    return run_tool(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = tool_parser(
        "dataset_tools.diff", "Compare two dataset versions from their manifests and catalogs."
    )
    parser.add_argument("old", help="the older dataset (directory, URI, or versions root)")
    parser.add_argument("new", help="the newer dataset")
    parser.add_argument("--json", action="store_true", help="print a machine-readable report")
    parser.add_argument(
        "--limit", type=int, default=10, help="examples listed per kind of change (10)"
    )
    parser.add_argument(
        "--fail_on_change",
        action="store_true",
        help="exit 1 when anything differs (for CI gates); by default exit 0 whenever it ran",
    )
    args = parse_tool_args(parser, argv)
    if args.limit < 0:
        parser.error(f"--limit must be >= 0, got {args.limit}")
    try:
        report = diff_datasets(args.old, args.new, limit=args.limit)
    except (OSError, ValueError) as e:  # includes object-store errors, which name the URI
        if args.json:
            print(json.dumps({"ok": False, "error": str(e)}))
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        _print_human(report)
    return 1 if args.fail_on_change and report.changed else 0


if __name__ == "__main__":
    sys.exit(main())
