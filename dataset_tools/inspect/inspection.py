"""What a dataset report shows, gathered by reading only what it shows.

``gather(dataset, per_class=N, seed=S)`` reads ``dataset.json``, the split catalogs and the
reports (``rejected.jsonl``, ``duplicates.jsonl``, ``near_duplicates.jsonl``), then reads from the
shards only the records it shows: N seeded samples per class and the members of the
near-duplicate pairs it lists, each by its byte range (the catalog's ``offset``/``length``, the
same numbers as the shard's index file) through ``tfrecord_io.random_access``. A report on a
million examples therefore reads about as many records as one on a thousand; what grows with
the dataset is reading the catalogs' columns. Local paths, ``s3://`` and ``gs://`` all work.

Images are decoded from the bytes as stored, as the trainer decodes them, and shrunk to
thumbnails. Rejected sources are opened where they are still readable (a truncated JPEG shows
the part that is there).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import io
import json
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image, ImageDraw, ImageFile

from catalog.near_duplicates import DEFAULT_THRESHOLD, classify, leakage_remedy
from catalog.window_search import WindowRule, find_window_pairs
from dataset_tools.foreign import ADOPTED_OPTION
from schemas import Manifest, example_proto
from schemas.framing import parse_frame
from schemas.image_example import KEY_ENCODED, KEY_FORMAT, KEY_HEIGHT, KEY_WIDTH
from schemas.shard_table import ShardTable
from tfrecord_io import source as _source
from tfrecord_io.random_access import DatasetFiles, dataset_files, load_catalog, read_range

__all__ = [
    "THUMBNAIL",
    "Thumbnail",
    "Sample",
    "PairView",
    "RejectedView",
    "Report",
    "gather",
    "imbalance",
    "histogram",
]

THUMBNAIL = 160  # longest side of a thumbnail, in pixels
MAX_PAIRS_SHOWN = 60
MAX_REJECTED_SHOWN = 12  # per reason, with thumbnails
MAX_DUPLICATES_SHOWN = 40
MAX_SOURCE_BYTES = 64 * 1024 * 1024  # rejected sources larger than this are not opened
IMBALANCE_RATIO = 1.5  # largest over smallest class in a split beyond which it is called out
_CATALOG_COLUMNS = [
    "key",
    "uri",
    "label",
    "text",
    "split",
    "index",
    "shard",
    "offset",
    "length",
    "height",
    "width",
    "format",
    "source_format",
    "source_bytes",
    "source_height",
    "source_width",
    "phash",
    "window_phash",
]
_READERS = 16  # ranged reads in flight (object stores answer each in tens of ms)


@dataclasses.dataclass(frozen=True)
class Thumbnail:
    """A small JPEG of an image, or why there is none (``data`` is then a placeholder)."""

    data: bytes
    width: int
    height: int
    note: str = ""  # "", or what went wrong ("unreadable record: ...", "partial")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One example shown in a contact sheet or a pair."""

    key: str
    uri: str
    label: int
    text: str
    split: str
    index: int
    shard: str
    stored: str  # "JPEG 256x341"
    thumbnail: Thumbnail


@dataclasses.dataclass(frozen=True)
class PairView:
    """A near-duplicate pair as listed in the report."""

    a: Sample | None
    b: Sample | None
    a_uri: str
    b_uri: str
    distance: int
    flipped: bool
    leakage: bool
    cross_class: bool


@dataclasses.dataclass(frozen=True)
class RejectedView:
    """A rejected source: reason, detail and a thumbnail when it is still readable."""

    uri: str
    reason: str
    detail: str
    thumbnail: Thumbnail | None


@dataclasses.dataclass
class Report:
    """Everything the HTML page, ``contact_sheet.png`` and ``stats.json`` show."""

    stats: dict[str, Any]
    samples: dict[str, list[Sample]]  # class name -> contact sheet
    pairs: list[PairView]
    rejected: dict[str, list[RejectedView]]  # reason -> the first few
    duplicates: list[dict[str, Any]]  # label conflicts first, then plain copies


def _placeholder(note: str, size: tuple[int, int] = (THUMBNAIL, THUMBNAIL * 3 // 4)) -> Thumbnail:
    image = Image.new("RGB", size, (120, 20, 20))
    ImageDraw.Draw(image).text((6, 6), note[:24], fill=(255, 255, 255))
    return Thumbnail(_jpeg(image), size[0], size[1], note)


def _jpeg(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def _thumbnail(image: Image.Image, note: str = "") -> Thumbnail:
    image = image.convert("RGB")
    image.thumbnail((THUMBNAIL, THUMBNAIL), Image.Resampling.BICUBIC)
    return Thumbnail(_jpeg(image), image.width, image.height, note)


def decode_stored(serialized: bytes) -> tuple[Image.Image, str]:
    """Decodes a stored example's image as the trainer does; returns it and ``"JPEG 256x341"``.

    Raises:
      ValueError: if the example has no image or its bytes do not decode.
    """
    example = example_proto.Example.FromString(serialized)
    feature = example.features.feature
    try:
        encoded = feature[KEY_ENCODED].bytes_list.value[0]
    except IndexError:
        raise ValueError(f"example has no {KEY_ENCODED}") from None
    fmt = feature[KEY_FORMAT].bytes_list.value[0].decode("ascii") if KEY_FORMAT in feature else ""
    height = feature[KEY_HEIGHT].int64_list.value[0] if KEY_HEIGHT in feature else 0
    width = feature[KEY_WIDTH].int64_list.value[0] if KEY_WIDTH in feature else 0
    if fmt == "RAW":
        pixels = np.frombuffer(encoded, np.uint8)
        if height * width == 0 or pixels.size % (height * width):
            raise ValueError(f"RAW image of {pixels.size} bytes is not {height}x{width}xC")
        channels = pixels.size // (height * width)
        image = Image.fromarray(pixels.reshape(height, width, channels).squeeze())
    else:
        try:
            image = Image.open(io.BytesIO(encoded))
            image.load()
        except (OSError, SyntaxError, ValueError) as e:
            raise ValueError(f"stored {fmt or 'image'} does not decode: {e}") from e
        fmt = fmt or (image.format or "")
    return image, f"{fmt} {image.width}x{image.height}"


def histogram(values: np.ndarray, edges: Sequence[float]) -> dict[str, Any]:
    """Counts of ``values`` in ``[edges[i], edges[i+1])``, the last bin open-ended."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    bounds = np.asarray(list(edges) + [np.inf], dtype=np.float64)
    counts, _ = np.histogram(values, bins=bounds)
    summary: dict[str, Any] = {"edges": list(edges), "counts": counts.astype(int).tolist()}
    if values.size:
        summary.update(
            min=float(values.min()),
            median=float(np.median(values)),
            mean=float(values.mean()),
            max=float(values.max()),
        )
    return summary


def imbalance(class_counts: dict[str, int]) -> dict[str, Any]:
    """How uneven a split's classes are; ``flagged`` when the report should say so."""
    if not class_counts:
        return {"flagged": False}
    smallest = min(class_counts, key=lambda k: (class_counts[k], k))
    largest = max(class_counts, key=lambda k: (class_counts[k], k))
    low, high = class_counts[smallest], class_counts[largest]
    missing = sorted(k for k, v in class_counts.items() if v == 0)
    ratio = high / low if low else None
    return {
        "smallest": smallest,
        "largest": largest,
        "max_over_min": round(ratio, 3) if ratio is not None else None,
        "missing": missing,
        "flagged": bool(missing) or (ratio is not None and ratio > IMBALANCE_RATIO),
    }


def _jsonl(files: DatasetFiles, name: str) -> Iterator[dict[str, Any]]:
    path = files.path(name)
    if not _source.exists(path):
        return
    for line in _source.read_bytes(path).decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def _catalogs(files: DatasetFiles) -> pa.Table:
    tables = [
        load_catalog(files, split, columns=_CATALOG_COLUMNS)
        for split in sorted(files.manifest.splits)
        if files.manifest.split(split).num_shards
    ]
    if not tables:
        return pa.table({name: pa.array([], pa.string()) for name in _CATALOG_COLUMNS})
    return pa.concat_tables(tables)


def _read_samples(files: DatasetFiles, rows: list[dict[str, Any]]) -> list[Sample]:
    """Reads each row's record by its byte range and makes its thumbnail, in parallel."""

    def one(row: dict[str, Any]) -> Sample:
        path = files.shard_path(row["shard"])
        note, stored = "", ""
        try:
            data = read_range(path, row["offset"], row["offset"] + row["length"])
            image, stored = decode_stored(parse_frame(data, name=path, offset=row["offset"]))
            thumb = _thumbnail(image)
        except (OSError, ValueError) as e:
            note = f"unreadable record: {e}"
            thumb = _placeholder(note)
        return Sample(
            key=row["key"],
            uri=row["uri"],
            label=row["label"],
            text=row["text"],
            split=row["split"],
            index=row["index"],
            shard=row["shard"],
            stored=stored,
            thumbnail=thumb,
        )

    with concurrent.futures.ThreadPoolExecutor(_READERS) as pool:
        return list(pool.map(one, rows))


def _sample_rows(
    table: pa.Table, labels: Sequence[str], per_class: int, seed: int
) -> dict[str, list[dict[str, Any]]]:
    """``{class name: rows}``: ``per_class`` seeded picks per class, in split then index order."""
    label_column = table.column("label").to_numpy(zero_copy_only=False)
    order = np.argsort(label_column, kind="stable")
    bounds = np.searchsorted(label_column[order], np.arange(len(labels) + 1))
    picks = []
    for label in range(len(labels)):
        positions = order[bounds[label] : bounds[label + 1]]
        rng = np.random.default_rng([seed, label])
        take = min(per_class, positions.size)
        picks.append(np.sort(rng.choice(positions, size=take, replace=False)))
    # One take for every class: each take reads across every column of the table.
    rows = table.take(pa.array(np.concatenate(picks or [np.zeros(0, np.int64)]), pa.int64()))
    rows = rows.to_pylist()
    split_order = {"train": 0, "validation": 1}
    chosen: dict[str, list[dict[str, Any]]] = {}
    start = 0
    for name, picked in zip(labels, picks, strict=True):
        mine = rows[start : start + picked.size]
        start += picked.size
        mine.sort(key=lambda r: (split_order.get(r["split"], 2), r["split"], r["index"]))
        chosen[name] = mine
    return chosen


def _catalog_windows(options: dict[str, Any], rows: pa.Table) -> tuple[WindowRule, np.ndarray]:
    """The build's window rule (``dataset.json``'s options) and the catalog rows' ``(N, W)``
    window hashes; whole frames alone where the catalogs hold no window hashes (a dataset
    built before them, or adopted)."""
    threshold = int(options.get("near_duplicate_threshold", DEFAULT_THRESHOLD))
    scales = tuple(options.get("near_duplicate_windows") or (1.0,))
    whole = rows.column("phash").to_numpy(zero_copy_only=False).astype(np.uint64)[:, None]
    column = rows.column("window_phash")
    if len(scales) == 1 or column.null_count:
        return WindowRule(threshold, threshold, (1.0,)), whole
    window_threshold = int(options.get("near_duplicate_window_threshold", threshold))
    others = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.uint64)
    windows = np.concatenate([whole, others.reshape(whole.shape[0], -1)], axis=1)
    return WindowRule(threshold, window_threshold, scales), windows


def _near_pairs(files: DatasetFiles, table: pa.Table) -> tuple[list[dict[str, Any]], str, int]:
    """The pairs from ``near_duplicates.jsonl``, or computed here from the catalogs' hashes."""
    threshold = int(files.manifest.options.get("near_duplicate_threshold", DEFAULT_THRESHOLD))
    listed = list(_jsonl(files, "near_duplicates.jsonl"))
    if listed or _source.exists(files.path("near_duplicates.jsonl")):
        return listed, "near_duplicates.jsonl", threshold
    hashes = table.column("phash")
    known = pc.invert(pc.is_null(hashes)).to_numpy(zero_copy_only=False)
    if not known.any():
        return [], "none (no perceptual hashes in the catalogs)", threshold
    rows = table.filter(pa.array(known))
    rule, windows = _catalog_windows(dict(files.manifest.options), rows)
    pairs = find_window_pairs(windows, rule).pairs
    splits = rows.column("split").to_numpy(zero_copy_only=False)
    labels = rows.column("label").to_numpy(zero_copy_only=False)
    leakage, cross = classify(pairs, splits, labels)
    members = rows.select(["key", "uri", "label", "text", "split"]).to_pylist()
    found: list[dict[str, Any]] = [
        {
            "a": members[a],
            "b": members[b],
            "distance": int(d),
            "flipped": bool(f),
            "leakage": bool(lk),
            "cross_class": bool(cc),
        }
        for a, b, d, f, lk, cc in zip(
            pairs.first, pairs.second, pairs.distance, pairs.flipped, leakage, cross, strict=True
        )
    ]
    found.sort(key=lambda p: (not p["leakage"], not p["cross_class"], p["distance"]))
    return found, "computed from the catalogs' phash column", threshold


def _source_thumbnail(uri: str) -> Thumbnail | None:
    """A thumbnail of a rejected source if it can still be opened (partly, if truncated)."""
    try:
        if _source.file_size(uri) > MAX_SOURCE_BYTES:
            return None
        data = _source.read_bytes(uri)
    except (OSError, ValueError):
        return None
    if not data:
        return None
    for partial in (False, True):
        previous = ImageFile.LOAD_TRUNCATED_IMAGES
        ImageFile.LOAD_TRUNCATED_IMAGES = partial
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                image = Image.open(io.BytesIO(data))
                image.draft("RGB", (THUMBNAIL, THUMBNAIL))
                image.load()
            return _thumbnail(image, "partial: the file ends early" if partial else "")
        except Exception:  # a rejected file fails in every way Pillow has
            continue
        finally:
            ImageFile.LOAD_TRUNCATED_IMAGES = previous
    return None


def _rejected(files: DatasetFiles) -> tuple[dict[str, int], dict[str, list[RejectedView]]]:
    counts: collections.Counter[str] = collections.Counter()
    shown: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in _jsonl(files, files.manifest.rejected_file or "rejected.jsonl"):
        reason = row.get("reason", "unknown")
        counts[reason] += 1
        if len(shown[reason]) < MAX_REJECTED_SHOWN:
            shown[reason].append(row)
    flat = [row for rows in shown.values() for row in rows]
    with concurrent.futures.ThreadPoolExecutor(_READERS) as pool:
        thumbs = dict(
            zip(
                (r["uri"] for r in flat),
                pool.map(_source_thumbnail, (r["uri"] for r in flat)),
                strict=True,
            )
        )
    views = {
        reason: [
            RejectedView(r["uri"], reason, r.get("detail", ""), thumbs.get(r["uri"])) for r in rows
        ]
        for reason, rows in sorted(shown.items(), key=lambda kv: (-counts[kv[0]], kv[0]))
    }
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), views


def _duplicates(files: DatasetFiles) -> tuple[dict[str, int], list[dict[str, Any]]]:
    conflicts: list[dict[str, Any]] = []
    plain: list[dict[str, Any]] = []
    total = conflict_count = 0
    for row in _jsonl(files, "duplicates.jsonl"):
        total += 1
        if row.get("label_conflict"):
            conflict_count += 1
            if len(conflicts) < MAX_DUPLICATES_SHOWN:
                conflicts.append(row)
        elif len(plain) < MAX_DUPLICATES_SHOWN:
            plain.append(row)
    return {"count": total, "label_conflicts": conflict_count}, conflicts + plain


def _distributions(table: pa.Table, files: DatasetFiles) -> dict[str, Any]:
    def column(name: str) -> np.ndarray:
        return table.column(name).to_numpy(zero_copy_only=False)

    def counts(name: str) -> dict[str, int]:
        values = table.column(name).fill_null("unknown").value_counts().to_pylist()
        return dict(sorted(((v["values"], v["counts"]) for v in values), key=lambda kv: -kv[1]))

    height = column("source_height").astype(np.float64)
    width = column("source_width").astype(np.float64)
    shards = _shard_rows(files.manifest)
    return {
        "source_format": counts("source_format"),
        "stored_format": counts("format"),
        "source_shorter_side": histogram(
            np.minimum(height, width), [0, 64, 128, 256, 384, 512, 768, 1024, 2048, 4096]
        ),
        "source_megapixels": histogram(height * width / 1e6, [0, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16]),
        "source_bytes": histogram(
            column("source_bytes").astype(np.float64),
            [0, 10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000, 10_000_000],
        ),
        "stored_bytes": histogram(
            column("length").astype(np.float64),
            [0, 5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 320_000],
        ),
        "shard_bytes": histogram(
            np.asarray([s["num_bytes"] for s in shards], np.float64),
            [0, 1 << 20, 16 << 20, 64 << 20, 128 << 20, 256 << 20],
        ),
        "shards": shards,
    }


def _shard_rows(manifest: Manifest) -> list[dict[str, Any]]:
    """Every shard's file, bytes and examples, splits in name order; from a shard table's
    three columns alone (no hashes, no index files) when the split has one."""
    rows: list[dict[str, Any]] = []
    names = ["file", "num_bytes", "num_examples"]
    for _, split in sorted(manifest.splits.items()):
        shards = split.shards
        if isinstance(shards, ShardTable):
            rows.extend(shards.columns(names).to_pylist())
        else:
            rows.extend({n: getattr(s, n) for n in names} for s in shards)
    return rows


def _rows_by_key(table: pa.Table, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
    wanted = pa.array(sorted(set(keys)), pa.string())
    hits = table.filter(pc.is_in(table.column("key"), value_set=wanted)).to_pylist()
    return {row["key"]: row for row in hits}


def gather(dataset: str, *, per_class: int = 16, seed: int = 0) -> Report:
    """Reads what the report shows (see the module docstring).

    Args:
      dataset: the dataset's root or ``dataset.json``, local or ``s3://`` / ``gs://``.
      per_class: examples per class in the contact sheets.
      seed: the sampling seed; the same seed shows the same examples.

    Raises:
      FileNotFoundError: without ``dataset.json`` or a catalog it lists.
      ValueError: for a damaged catalog or manifest, or ``per_class`` < 1.
    """
    if per_class < 1:
        raise ValueError(f"--per_class must be >= 1, got {per_class}")
    files = dataset_files(dataset)
    manifest = files.manifest
    table = _catalogs(files)
    labels = list(manifest.label_names)
    sample_rows = _sample_rows(table, labels, per_class, seed)
    pair_rows, pair_source, threshold = _near_pairs(files, table)
    shown_pairs = pair_rows[:MAX_PAIRS_SHOWN]
    located = _rows_by_key(table, (p[m]["key"] for p in shown_pairs for m in ("a", "b")))
    to_read = [row for rows in sample_rows.values() for row in rows]
    sampled = {row["key"] for row in to_read}
    to_read += [located[k] for k in sorted(located) if k not in sampled]
    read = {s.key: s for s in _read_samples(files, to_read)}
    samples = {name: [read[r["key"]] for r in rows] for name, rows in sample_rows.items()}
    pairs = [_pair_view(p, read) for p in shown_pairs]
    rejected_counts, rejected = _rejected(files)
    duplicate_counts, duplicates = _duplicates(files)
    stats = {
        "dataset": str(dataset),
        "seed": seed,
        "per_class": per_class,
        "label_names": labels,
        "counts": _counts(manifest, table, rejected_counts),
        "splits": _split_stats(manifest, table),
        "num_shards": sum(split.num_shards for split in manifest.splits.values()),
        "total_bytes": sum(split.num_bytes for split in manifest.splits.values()),
        "image": dataclasses.asdict(manifest.image),
        "options": dict(manifest.options),
        "lineage": dict(manifest.lineage) if manifest.lineage is not None else None,
        "distributions": _distributions(table, files),
        "rejected": {"count": manifest.counts.rejected, "by_reason": rejected_counts},
        "duplicates": duplicate_counts,
        "near_duplicates": _near_duplicate_stats(
            pair_rows, pair_source, threshold, remedy=_leakage_remedy(manifest, files.root)
        ),
        "samples": {
            name: [
                {
                    "key": s.key,
                    "uri": s.uri,
                    "split": s.split,
                    "index": s.index,
                    "note": s.thumbnail.note,
                }
                for s in rows
            ]
            for name, rows in samples.items()
        },
        "records_read": len(to_read),
        "bytes_read": int(sum(r["length"] for r in to_read)),
    }
    return Report(stats, samples, pairs, rejected, duplicates)


def _counts(manifest: Manifest, table: pa.Table, rejected: dict[str, int]) -> dict[str, int]:
    """``dataset.json``'s counts, with ``upscaled`` and ``too_small`` always there: a dataset
    made before they were recorded gets them from its catalog and its rejected report."""
    counts = manifest.counts.to_dict()
    if "upscaled" not in counts:
        stored = np.minimum(_numbers(table, "height"), _numbers(table, "width"))
        source = np.minimum(_numbers(table, "source_height"), _numbers(table, "source_width"))
        counts["upscaled"] = int(np.count_nonzero(stored > source))  # NaN (unknown) is False
    counts.setdefault("too_small", rejected.get("too_small", 0))
    return counts


def _numbers(table: pa.Table, name: str) -> np.ndarray:
    """A catalog column as floats, NaN where null."""
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), np.float64)


def _split_stats(manifest: Manifest, table: pa.Table) -> dict[str, dict[str, Any]]:
    """Per split: its size, and how many examples each class has (from the catalogs when
    ``dataset.json`` does not say)."""
    labels = list(manifest.label_names)
    splits = {}
    for name, split in sorted(manifest.splits.items()):
        class_counts = dict(split.class_counts) if split.class_counts is not None else None
        if class_counts is None and table.num_rows:
            mine = table.filter(pc.equal(table.column("split"), name)).column("label")
            found = collections.Counter(mine.to_pylist())
            class_counts = {n: found.get(i, 0) for i, n in enumerate(labels)}
        splits[name] = {
            "examples": split.num_examples,
            "shards": split.num_shards,
            "bytes": split.num_bytes,
            "class_counts": class_counts,
            "imbalance": imbalance(class_counts or {}),
        }
    return splits


def _near_duplicate_stats(
    pair_rows: list[dict[str, Any]], source: str, threshold: int, *, remedy: str | None
) -> dict[str, Any]:
    """The near-duplicate pairs' numbers, and the leakage pairs (up to ``MAX_PAIRS_SHOWN``).

    ``remedy`` (``catalog.near_duplicates.leakage_remedy``) is kept only when there is leakage.
    """
    leakage = sum(bool(p["leakage"]) for p in pair_rows)
    return {
        "source": source,
        "threshold": threshold,
        "pairs": len(pair_rows),
        "leakage": leakage,
        "remedy": remedy if leakage else None,
        "cross_class": sum(bool(p["cross_class"]) for p in pair_rows),
        "shown": min(len(pair_rows), MAX_PAIRS_SHOWN),
        "leakage_pairs": [
            {"a": p["a"]["uri"], "b": p["b"]["uri"], "distance": p["distance"]}
            for p in pair_rows
            if p["leakage"]
        ][:MAX_PAIRS_SHOWN],
    }


def _leakage_remedy(manifest: Manifest, root: str) -> str | None:
    """How to move a dataset's leakage to train (a rebuild with ``--base`` on it), or None for
    adopted shards, which the pipeline did not build (``--base`` needs a pipeline build)."""
    if manifest.options.get(ADOPTED_OPTION) is not None:
        return None
    return leakage_remedy(root)


def _pair_view(pair: dict[str, Any], read: dict[str, Sample]) -> PairView:
    """A listed pair as the report shows it, with the samples read for it (None if unread)."""
    return PairView(
        read.get(pair["a"]["key"]),
        read.get(pair["b"]["key"]),
        pair["a"]["uri"],
        pair["b"]["uri"],
        int(pair["distance"]),
        bool(pair.get("flipped", False)),
        bool(pair["leakage"]),
        bool(pair["cross_class"]),
    )
