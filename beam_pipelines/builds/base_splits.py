"""The split each example of a ``--base`` dataset is in, read from the base's catalogs.

A stratified build on a base (``--stratify_validation --base``) keeps every example the base
holds in the split the base gave it (``graph.splits``, rule ``class_quota_keeping_base``).
That split is read here, from the catalog files ``dataset.json`` lists under each split, and
never re-derived from the example's hash: the base may have been placed by another rule
(``split_value``, a base built without ``--stratify_validation``), another
``--validation_fraction``, or had examples moved by ``--leakage move_to_train``.

The launcher checks the base before anything is written (``base_splits_spec``); the job reads
each catalog file on a worker of its own (``ReadBaseSplits``), checked against the size and
SHA-256 ``dataset.json`` lists, one batch of its ``key`` column at a time, and hands on one
``(key, split)`` per base example, which ``AssignSplits`` joins with the new build's records by
content.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.builds.incremental import BaseDamagedError, BaseDataset, BaseRefusedError
from beam_pipelines.engines.filesystems import read_object
from beam_pipelines.output.shards import TRAIN, VALIDATION
from catalog.partitions import iter_catalog_batches
from schemas.manifest import FileInfo

__all__ = [
    "BaseCatalogFile",
    "BaseSplitsSpec",
    "base_splits_spec",
    "read_base_splits",
    "ReadBaseSplits",
]

_log = logging.getLogger(__name__)
# Rules under which a build placed its examples by class quotas (graph.splits.SPLIT_RULES).
_QUOTA_RULES = ("class_quota", "class_quota_keeping_base")


class BaseCatalogFile(NamedTuple):
    """One catalog file of the base: the split it lists and the file as ``dataset.json``
    lists it (path relative to ``root``, size, SHA-256)."""

    root: str
    split: str
    info: FileInfo


class BaseSplitsSpec(NamedTuple):
    """What the job reads the base's splits from (small, pickles cheaply)."""

    root: str
    files: tuple[BaseCatalogFile, ...]


def base_splits_spec(
    base: BaseDataset | None, *, stratify: bool, validation_fraction: float
) -> BaseSplitsSpec | None:
    """The base's catalog files to keep its splits from, or None when the build does not keep
    them (no base, or no ``--stratify_validation``: it then logs when that re-places examples
    a base placed by class quotas).

    Raises:
      BaseRefusedError: (a ``ValueError``) naming the flag that fixes it, for a base with a
        split other than ``train`` and ``validation``, a split with examples but no catalog,
        or validation examples while ``--validation_fraction`` is 0 (they would move to train).
    """
    if base is None:
        return None
    rule = base.manifest.options.get("split_rule")
    if not stratify:
        if rule in _QUOTA_RULES:
            _log.warning(
                "--base %s placed its examples by class quotas (split_rule %s); without "
                "--stratify_validation every example is placed by its split value, so some "
                "move between train and validation: add --stratify_validation to keep them",
                base.root,
                rule,
            )
        return None
    files = []
    for split in sorted(base.manifest.splits):
        info = base.manifest.split(split)
        if info.num_examples == 0:
            continue
        if split not in (TRAIN, VALIDATION):
            raise BaseRefusedError(
                f"--base {base.root} has a split {split!r} ({info.num_examples} examples): a "
                f"build keeps only {TRAIN} and {VALIDATION}; leave out --stratify_validation, "
                "or build without --base"
            )
        if split == VALIDATION and validation_fraction == 0:
            raise BaseRefusedError(
                f"--validation_fraction 0 would move the {info.num_examples} validation examples "
                f"of --base {base.root} to train, and --stratify_validation keeps every example "
                f"of the base where it is: pass --validation_fraction "
                f"{base.manifest.options.get('validation_fraction', 'F')}, or leave out "
                "--stratify_validation or --base"
            )
        if not info.catalog_files:
            raise BaseRefusedError(
                f"--base {base.root} lists no catalog for split {split!r} (built before "
                "catalogs): its splits cannot be kept; rebuild the base, or leave out "
                "--stratify_validation or --base"
            )
        files += [BaseCatalogFile(base.root, split, f) for f in info.catalog_files]
    return BaseSplitsSpec(base.root, tuple(files))


def read_base_splits(file: BaseCatalogFile) -> Iterator[tuple[str, str]]:
    """``(key, split)`` for every row of one base catalog file, one batch at a time.

    Raises:
      BaseDamagedError: if the file differs from what ``dataset.json`` lists, or is no catalog.
    """

    def read(info: FileInfo) -> bytes:
        return read_object(FileSystems.join(file.root, info.file))

    try:
        for batch in iter_catalog_batches(
            [file.info],
            read,
            columns=["key"],
            where=lambda info: FileSystems.join(file.root, info.file),
        ):
            for key in batch.column("key").to_pylist():
                yield key, file.split
    except ValueError as e:
        raise BaseDamagedError(
            f"--base {file.root}: {e}; its splits cannot be kept: repair the base, or build "
            "without --base or --stratify_validation"
        ) from e


class ReadBaseSplits(beam.PTransform):
    """``PBegin -> (key, split)`` for every example of the base, each catalog file read by a
    task of its own."""

    def __init__(self, spec: BaseSplitsSpec) -> None:
        super().__init__()
        self._spec = spec

    def expand(self, pbegin):
        return (
            pbegin
            | "CatalogFiles" >> beam.Create(self._spec.files)
            # BaseCatalogFile
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadKeys" >> beam.FlatMap(read_base_splits)
            # (key, split)
        )
