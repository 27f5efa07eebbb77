"""Reports, the staged result, and publishing ``dataset.json`` as the commit point.

The pipeline's last step writes ``rejected.jsonl`` and ``duplicates.jsonl`` (sorted by URI) and
a hidden staged summary. The launching process then decides: if the bad fraction is within
``--max_bad_fraction`` (and, with ``--label_conflicts fail``, no label conflict was found) it
writes ``dataset.json`` (last, under a temporary name then renamed) and removes shard files no
manifest lists; otherwise it leaves the dataset unpublished. Every
read, write, rename and delete goes through Beam FileSystems, so the output may be any scheme
Beam knows (local, ``gs://``, ``s3://``…).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.elements import Duplicate, Rejection, ShardResult
from beam_pipelines.engines.filesystems import create_empty_file, write_object
from beam_pipelines.output.catalog_io import CatalogResult
from beam_pipelines.output.reports import WriteSortedReport
from catalog.index_files import index_filename
from schemas.manifest import (
    MANIFEST_NAME,
    REJECTED_NAME,
    Counts,
    FileInfo,
    ImageSpec,
    Manifest,
    ShardInfo,
    SplitInfo,
    TableShards,
    parse_shard_filename,
    shard_table_name,
)
from schemas.shard_table import decode_manifest, encode_manifest

__all__ = [
    "DUPLICATES_NAME",
    "OutputExistsError",
    "OutputNotWritableError",
    "StagedResult",
    "StageResults",
    "label_conflict_groups",
    "RejectedSummary",
    "DuplicatesSummary",
    "staged_path",
    "write_text",
    "read_text",
    "read_manifest",
    "read_manifest_file",
    "prepare_output",
    "read_staged",
    "build_manifest",
    "publish_manifest",
    "ClassCounts",
    "remove_unlisted_shards",
]

DUPLICATES_NAME = "duplicates.jsonl"
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED
# Rejected for this reason, a file is outside every class folder: not bad image data.
_NO_LABEL = "no_label"
_TOO_SMALL = "too_small"  # prepare.REASON_CODES; the manifest counts it on its own
_SKIPPED_EXAMPLES = 3


class OutputExistsError(ValueError):
    """The output already holds a published dataset and ``--overwrite`` was not given."""


class OutputNotWritableError(ValueError):
    """The output cannot be written (a missing bucket, no permission), found before any work."""


def write_text(path: str, text: str) -> None:
    """Writes UTF-8 text as the whole file ``path``: one retried PUT on buckets (whole or
    absent), a temporary name then a rename elsewhere (``object_store_io.write_object``)."""
    write_object(path, text.encode("utf-8"))


def read_text(path: str) -> str:
    """Reads a whole UTF-8 file through FileSystems."""
    with FileSystems.open(path, compression_type=_UNCOMPRESSED) as handle:
        return handle.read().decode("utf-8")


def staged_path(output_dir: str, run_id: str) -> str:
    """Where a run leaves its staged summary for the launcher."""
    return FileSystems.join(output_dir, f".staged-{run_id}.json")


def label_conflict_groups(duplicates: Iterable[Duplicate]) -> list[dict[str, Any]]:
    """Groups the label conflicts among ``duplicates`` by content hash.

    Returns:
      One dict per conflicting content hash, sorted by it: ``sha256``, ``copies`` (sorted
      ``[uri, class name]`` pairs, the kept copy included) and ``kept_uri`` (None when every
      copy was dropped).
    """
    groups: dict[str, dict[str, Any]] = {}
    for d in duplicates:
        if not d.label_conflict:
            continue
        group = groups.setdefault(d.sha256, {"copies": {}, "kept_uri": d.kept_uri})
        group["copies"][d.uri] = d.label
        if d.kept_uri is not None:
            group["copies"][d.kept_uri] = d.kept_label
    return [
        {"sha256": sha, "copies": sorted(map(list, g["copies"].items())), "kept_uri": g["kept_uri"]}
        for sha, g in sorted(groups.items())
    ]


class RejectedSummary:
    """Counts rejections by reason as ``rejected.jsonl`` is written (``reports.Summarizer``),
    one key range at a time."""

    def __init__(self) -> None:
        self._reasons: dict[str, int] = {}

    def add(self, rejection: Rejection) -> None:
        self._reasons[rejection.reason] = self._reasons.get(rejection.reason, 0) + 1

    def state(self) -> dict[str, int]:
        return dict(self._reasons)

    def merge(self, state: dict[str, int]) -> None:
        # Counts: any order gives the same sums.
        for reason, count in state.items():
            self._reasons[reason] = self._reasons.get(reason, 0) + count

    def result(self) -> dict[str, Any]:
        return {
            "count": sum(self._reasons.values()),
            "by_reason": dict(sorted(self._reasons.items())),
        }


class DuplicatesSummary:
    """Counts duplicates and groups label conflicts as ``duplicates.jsonl`` is written.

    Only the label conflicts are kept (copies of one file under two classes: labelling errors,
    few in any dataset worth publishing); plain duplicates are only counted. The groups depend
    on the order (``kept_uri`` is the first line's of its group, in URI order), so they are
    made only in ``result``, from every conflict in report order: ``merge`` appends a later key
    range's conflicts after this one's.
    """

    def __init__(self) -> None:
        self._count = 0
        self._conflicts: list[Duplicate] = []

    def add(self, duplicate: Duplicate) -> None:
        self._count += 1
        if duplicate.label_conflict:
            self._conflicts.append(duplicate)

    def state(self) -> tuple[int, list[Duplicate]]:
        return self._count, list(self._conflicts)

    def merge(self, state: tuple[int, list[Duplicate]]) -> None:
        count, conflicts = state
        self._count += count
        self._conflicts.extend(conflicts)

    def result(self) -> dict[str, Any]:
        return {"count": self._count, "label_conflicts": label_conflict_groups(self._conflicts)}


class ClassCounts(beam.CombineFn):
    """``ShardResult -> (examples, {label: examples})``: one split's examples and its class
    counts, summed shard by shard, so that no step holds every shard's ``label_counts`` (a
    shard of N classes carries up to N pairs: 500 M pairs at 512 k shards of 1,000 classes)."""

    def create_accumulator(self) -> tuple[int, Counter[int]]:
        return 0, Counter()

    def add_input(self, acc, shard: ShardResult):
        examples, labels = acc
        labels.update(dict(shard.label_counts))
        return examples + shard.num_examples, labels

    def merge_accumulators(self, accumulators):
        examples, labels = self.create_accumulator()
        for more, their_labels in accumulators:
            examples += more
            labels.update(their_labels)
        return examples, labels

    def extract_output(self, acc) -> dict[str, Any]:
        examples, labels = acc
        return {"examples": examples, "labels": sorted(labels.items())}


class _StageFn(beam.DoFn):
    def __init__(self, output_dir: str, run_id: str) -> None:
        self._output_dir = output_dir
        self._run_id = run_id

    def process(
        self,
        _,
        input_count,
        label_names,
        shards,
        rejected,
        duplicates,
        class_counts,
        catalogs=(),
        skipped_count=0,
        skipped_examples=(),
        near_duplicates=None,
    ):
        # rejected, duplicates: the summaries of the reports, already written (WriteSortedReport)
        # shards: without their label_counts, summed per split in class_counts instead
        staged = {
            "input": input_count,
            "label_names": list(label_names),
            "shards": [s._asdict() for s in sorted(shards)],
            "class_counts": dict(class_counts),
            "catalogs": [c._asdict() for c in sorted(catalogs)],
            "rejected": rejected["count"],
            "rejected_by_reason": rejected["by_reason"],
            "duplicates": duplicates["count"],
            "label_conflicts": duplicates["label_conflicts"],
            "skipped": skipped_count,
            "skipped_examples": sorted(skipped_examples),
            "near_duplicates": near_duplicates,
        }
        path = staged_path(self._output_dir, self._run_id)
        write_text(path, json.dumps(staged, ensure_ascii=False, sort_keys=True))
        yield path


class StageResults(beam.PTransform):
    """``dict of results -> str``: writes the reports and the staged summary; yields its path.

    Takes the dict ``ImagesToShards`` returns.
    """

    def __init__(self, output_dir: str, run_id: str) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._run_id = run_id

    def expand(self, results):
        as_list = beam.pvalue.AsList
        input_count = results["sources"] | "CountInputs" >> beam.combiners.Count.Globally()
        # (split, {"examples", "labels"}), one a split; the shards then go without theirs.
        class_counts = (
            results["shards"]
            | "BySplit" >> beam.Map(lambda shard: (shard.split, shard))
            | "ClassCounts" >> beam.CombinePerKey(ClassCounts())
        )
        shards = results["shards"] | "WithoutClassCounts" >> beam.Map(
            ShardResult.without_label_counts
        )
        # Written sorted with bounded memory; only their counts reach the summary below.
        rejected = results["rejected"] | "RejectedReport" >> WriteSortedReport(
            self._output_dir, REJECTED_NAME, Rejection, RejectedSummary
        )
        duplicates = results["duplicates"] | "DuplicatesReport" >> WriteSortedReport(
            self._output_dir, DUPLICATES_NAME, Duplicate, DuplicatesSummary
        )
        skipped = {}
        if "skipped" in results:
            # str (URI) -> int, and -> [str], the first few in URI order
            count = results["skipped"] | "CountSkipped" >> beam.combiners.Count.Globally()
            first = results["skipped"] | "FirstSkipped" >> beam.combiners.Top.Smallest(
                _SKIPPED_EXAMPLES
            )
            skipped = {
                "skipped_count": beam.pvalue.AsSingleton(count),
                "skipped_examples": beam.pvalue.AsSingleton(first),
            }
        near_duplicates = {}
        if "near_duplicates" in results:
            # {pairs, leakage, cross_class, moved_to_train...}, one element (leakage.py)
            near_duplicates = {
                "near_duplicates": beam.pvalue.AsSingleton(results["near_duplicates"])
            }
        return (
            results["sources"].pipeline
            | "Once" >> beam.Create([None])
            | "WriteReports"
            >> beam.ParDo(
                _StageFn(self._output_dir, self._run_id),
                beam.pvalue.AsSingleton(input_count),
                beam.pvalue.AsSingleton(results["label_names"]),
                as_list(shards),
                beam.pvalue.AsSingleton(rejected),
                beam.pvalue.AsSingleton(duplicates),
                as_list(class_counts),
                *([as_list(results["catalogs"])] if "catalogs" in results else []),
                **skipped,
                **near_duplicates,
            )
        )


class StagedResult:
    """What the pipeline produced, read back by the launcher from the staged summary.

    The bad fraction, which ``--max_bad_fraction`` bounds, is the share of bad input among the
    inputs inside a class: ``(rejected - no_label) / (input - no_label)``. Files outside every
    class folder (``no_label``) are reported but are not bad image data; skipped hidden and
    system files are not inputs at all.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.input: int = data["input"]
        self.label_names: tuple[str, ...] = tuple(data["label_names"])
        self.shards: tuple[ShardResult, ...] = tuple(
            ShardResult(**{**s, "label_counts": tuple(map(tuple, s.get("label_counts", ())))})
            for s in data["shards"]
        )
        self.rejected: int = data["rejected"]
        self.rejected_by_reason: dict[str, int] = dict(data["rejected_by_reason"])
        self.duplicates: int = data["duplicates"]
        self.label_conflicts: list[dict[str, Any]] = list(data.get("label_conflicts", ()))
        self.skipped: int = data.get("skipped", 0)
        self.skipped_examples: list[str] = list(data.get("skipped_examples", ()))
        self.near_duplicates: dict[str, Any] | None = data.get("near_duplicates")
        self.catalogs: tuple[CatalogResult, ...] = tuple(
            CatalogResult(**c) for c in data.get("catalogs", ())
        )
        # split -> {"examples": n, "labels": [[label, n], ...]} (ClassCounts)
        self._class_counts: dict[str, dict[str, Any]] = dict(data.get("class_counts", {}))

    @property
    def written(self) -> int:
        return sum(s.num_examples for s in self.shards)

    @property
    def upscaled(self) -> int:
        """Examples written that are stored larger than their source."""
        return sum(s.upscaled for s in self.shards)

    @property
    def too_small(self) -> int:
        """Sources rejected for a shorter side below ``--min_source_side``."""
        return self.rejected_by_reason.get(_TOO_SMALL, 0)

    @property
    def no_label(self) -> int:
        return self.rejected_by_reason.get(_NO_LABEL, 0)

    @property
    def bad_fraction(self) -> float:
        labelled = self.input - self.no_label
        return (self.rejected - self.no_label) / labelled if labelled else 0.0

    def class_counts(self, split: str) -> dict[str, int] | None:
        """Examples per class name (every class, label order) in ``split``; None if unknown."""
        counted = self._class_counts.get(split, {"examples": 0, "labels": []})
        counts = dict.fromkeys(self.label_names, 0)
        for label, n in counted["labels"]:
            counts[self.label_names[label]] += n
        if sum(counts.values()) != counted["examples"]:
            return None  # records without a class (foreign callers of the shard writer)
        return counts


def read_staged(output_dir: str, run_id: str) -> StagedResult:
    """Reads and deletes a run's staged summary."""
    path = staged_path(output_dir, run_id)
    result = StagedResult(json.loads(read_text(path)))
    FileSystems.delete([path])
    return result


def read_manifest(output_dir: str) -> Manifest | None:
    """The published manifest in ``output_dir``, or None if there is none.

    Raises:
      ValueError: if a ``dataset.json`` exists but is not a valid manifest.
    """
    path = FileSystems.join(output_dir, MANIFEST_NAME)
    if not FileSystems.exists(path):
        return None
    return read_manifest_file(path)


def read_manifest_file(path: str, data: bytes | None = None) -> Manifest:
    """Parses the ``dataset.json`` at ``path`` (its bytes ``data`` when already read), of either
    layout; a version-2 split's shard table, next to it, is read through FileSystems and checked
    when its entries are first used.

    Raises:
      ValueError: if it is not a valid manifest (later: if a shard table is damaged).
      FileNotFoundError: later, if a shard table it names is missing.
    """
    directory = FileSystems.split(path)[0]

    def read_file(relative: str) -> bytes:
        table = FileSystems.join(directory, relative)
        if not FileSystems.exists(table):
            raise FileNotFoundError(f"{table} does not exist")
        with FileSystems.open(table, compression_type=_UNCOMPRESSED) as handle:
            return bytes(handle.read())

    return decode_manifest(read_text(path) if data is None else data, read_file)


def prepare_output(output_dir: str, *, overwrite: bool) -> Manifest | None:
    """Checks that a run may write to ``output_dir``; with ``overwrite`` unpublishes the old dataset.

    Unpublishing (deleting the old ``dataset.json``) comes before any shard is rewritten, so no
    reader ever trusts a manifest whose shards are being replaced.

    Returns:
      The old manifest when overwriting a published dataset (to clean up its shards later),
      else None.

    Raises:
      OutputExistsError: if ``dataset.json`` exists and ``overwrite`` is False. Nothing is
        changed in that case.
      OutputNotWritableError: if a probe object cannot be written and deleted in ``output_dir``
        (a missing bucket, a 403), naming it; nothing else is written then.
    """
    path = FileSystems.join(output_dir, MANIFEST_NAME)
    if not FileSystems.exists(path):
        _probe_writable(output_dir)
        return None
    if not overwrite:
        raise OutputExistsError(
            f"{path} already exists: the output holds a published dataset. Pass --overwrite to "
            "replace it, or choose another --output."
        )
    _probe_writable(output_dir)
    try:
        old = read_manifest_file(path)
        old.all_shards()  # a shard table is read now, before the old manifest goes
    except (ValueError, FileNotFoundError):
        old = None  # an unreadable manifest lists nothing we could clean up
    FileSystems.delete([path])
    return old


def _probe_writable(output_dir: str) -> None:
    # Object stores report a missing bucket as a missing object, and a refused write only when
    # it happens: write and delete one empty object now rather than fail after all the work.
    probe = FileSystems.join(output_dir, f".write-probe-{uuid.uuid4().hex}")
    try:
        create_empty_file(probe)
        FileSystems.delete([probe])
    except Exception as e:  # any storage failure here means the run cannot publish
        raise OutputNotWritableError(
            f"--output {output_dir} is not writable ({type(e).__name__}: {e}); check that the "
            "bucket exists and the credentials may write to it"
        ) from e


def split_catalog_files(catalogs: Sequence[CatalogResult]) -> dict[str, tuple[FileInfo, ...]]:
    """Each split's catalog files in partition order: one, or its partitions.

    Raises:
      ValueError: if a split's partitions are not exactly ``0..n-1`` of ``n``.
    """
    by_split: dict[str, list[CatalogResult]] = {}
    for c in catalogs:
        by_split.setdefault(c.split, []).append(c)
    files = {}
    for split, parts in sorted(by_split.items()):
        parts.sort(key=lambda c: c.partition)
        found = [(c.partition, c.partitions) for c in parts]
        if found != [(p, len(parts)) for p in range(len(parts))]:
            raise ValueError(
                f"the catalog of split {split!r} came as partitions {found} (partition, of): "
                "some are missing or repeated"
            )
        files[split] = tuple(FileInfo(c.file, c.num_bytes, c.sha256) for c in parts)
    return files


def build_manifest(
    staged: StagedResult, *, image: ImageSpec, options: dict[str, Any], splits: Sequence[str]
) -> Manifest:
    """Builds the manifest; ``splits`` are always listed, even when empty.

    Raises:
      ValueError: if the counts do not add up (an input was lost), naming the numbers.
    """
    by_split: dict[str, list[ShardResult]] = {name: [] for name in splits}
    for shard in staged.shards:
        by_split.setdefault(shard.split, []).append(shard)
    catalogs = split_catalog_files(staged.catalogs)
    split_infos = {
        name: SplitInfo(
            num_examples=sum(s.num_examples for s in shards),
            shards=tuple(
                ShardInfo(
                    file=s.file,
                    num_examples=s.num_examples,
                    num_bytes=s.num_bytes,
                    sha256=s.sha256,
                    index=FileInfo(index_filename(s.file), s.index_bytes, s.index_sha256)
                    if s.index_sha256
                    else None,
                )
                for s in sorted(shards, key=lambda s: s.index)
            ),
            catalog=catalogs[name][0] if len(catalogs.get(name, ())) == 1 else None,
            catalog_partitions=catalogs[name] if len(catalogs.get(name, ())) > 1 else (),
            class_counts=staged.class_counts(name),
        )
        for name, shards in by_split.items()
    }
    return Manifest(
        label_names=staged.label_names,
        splits=split_infos,
        counts=Counts(
            input=staged.input,
            written=staged.written,
            rejected=staged.rejected,
            duplicates=staged.duplicates,
            skipped=staged.skipped,
            upscaled=staged.upscaled,
            too_small=staged.too_small,
        ),
        image=image,
        rejected_file=REJECTED_NAME,
        options=options,
    )


def publish_manifest(output_dir: str, manifest: Manifest) -> str:
    """Writes the shard tables, then ``dataset.json`` (the commit point, naming each table's
    size and SHA-256), and returns its path. Each file is written whole or not at all."""
    text, tables = encode_manifest(manifest)
    for name, data in sorted(tables.items()):
        write_object(FileSystems.join(output_dir, name), data)
    path = FileSystems.join(output_dir, MANIFEST_NAME)
    write_text(path, text)
    return path


def _listed_tables(manifest: Manifest) -> set[str]:
    return {
        split.shards.table.file
        for split in manifest.splits.values()
        if isinstance(split.shards, TableShards)
    } | {shard_table_name(name) for name in manifest.splits if manifest.format_version > 1}


def remove_unlisted_shards(output_dir: str, manifest: Manifest, old: Manifest | None) -> list[str]:
    """Deletes shard files (and shard tables) the published manifest does not list; returns
    what was deleted.

    Candidates are the files the previous manifest listed and every file in ``output_dir``
    named like a shard or a shard table (left by an earlier unpublished run). Other files are
    never touched.
    """
    listed = {shard.file for shard in manifest.all_shards()}
    candidates = set(old and [s.file for s in old.all_shards()] or [])
    matched = FileSystems.match([FileSystems.join(output_dir, "*.tfrecord")])[0].metadata_list
    for meta in matched:
        name = FileSystems.split(meta.path)[1]
        try:
            parse_shard_filename(name)
        except ValueError:
            continue
        candidates.add(name)
    listed |= _listed_tables(manifest)
    candidates |= _listed_tables(old) if old is not None else set()
    tables = FileSystems.match([FileSystems.join(output_dir, "shards-*.parquet")])[0]
    candidates |= {FileSystems.split(meta.path)[1] for meta in tables.metadata_list}
    stale = sorted(candidates - listed)
    paths = [FileSystems.join(output_dir, name) for name in stale]
    existing = [p for p in paths if FileSystems.exists(p)]
    if existing:
        FileSystems.delete(existing)
    return existing
