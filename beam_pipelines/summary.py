"""What a pipeline run did: ``RunSummary``, printed for people or as JSON for machines."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_pipelines.graph.leakage import summary_lines
from beam_pipelines.inputs.listings import display_label
from beam_pipelines.output.publish import DUPLICATES_NAME
from cliflags import plural
from schemas.manifest import MANIFEST_NAME, REJECTED_NAME, Manifest

__all__ = ["RunSummary", "TOP_REASONS", "NOT_IMAGES", "CLASSES_IN_FULL", "CLASSES_AT_EACH_END"]

TOP_REASONS = 5
# Rejections of inputs that are no image to prepare, left out of images/s: never read (no
# class folder, a bad listing line or class name), empty, or no image format in the bytes
# (a README.txt in a class folder). Every other input counts: written, duplicates, and
# images rejected for what their bytes hold (truncated, too small...).
NOT_IMAGES = ("no_label", "bad_listing_line", "bad_label", "empty_file", "not_an_image")
_CONFLICTS_SHOWN = 5
# Past this many classes the summary's table shows only the smallest and the largest
# (CLASSES_AT_EACH_END each); dataset.json's class_counts holds them all.
CLASSES_IN_FULL = 25
CLASSES_AT_EACH_END = 5


def _relative_to_input(uri: str, root: str) -> str:
    """``uri`` as a path under ``--input`` (``cats/.DS_Store``): bare names would not say which
    folder holds the file; the whole URI where it is not under ``root``."""
    candidates = [root] if "://" in root else [root, os.path.abspath(root)]
    for base in candidates:
        prefix = base.rstrip("/") + "/"
        if base and uri.startswith(prefix):
            return uri[len(prefix) :]
    return uri


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What a run did.

    Attributes:
      output: the dataset directory.
      published: True if ``dataset.json`` was written.
      manifest: the manifest written, or that would have been written when not published.
      bad_fraction: rejected / input, not counting ``no_label`` files (see ``StagedResult``).
      rejected_by_reason: rejection counts per reason code.
      metrics: Beam counters of the run, by name.
      removed: stale files deleted after publishing.
      elapsed_s: wall time of the run, launch to publish.
      skipped_examples: the first few hidden or system files skipped (their count is
        ``manifest.counts.skipped``).
      label_conflicts: one dict per content hash found under different classes
        (``publish.label_conflict_groups``).
      not_published_because: why the dataset was not published, one line per gate that failed.
      near_duplicates: the near-duplicate counts (``leakage``), None when not searched.
      reused_from_staging: for a ``--resume`` run, the inputs whose examples an earlier attempt
        had staged (neither read nor decoded again); None for a run that did not resume.
    """

    output: str
    published: bool
    manifest: Manifest
    bad_fraction: float
    rejected_by_reason: dict[str, int]
    metrics: dict[str, int]
    removed: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    skipped_examples: tuple[str, ...] = ()
    label_conflicts: tuple[dict[str, Any], ...] = ()
    not_published_because: tuple[str, ...] = ()
    near_duplicates: dict[str, Any] | None = None
    reused_from_staging: int | None = None

    @property
    def images(self) -> int:
        """The inputs that are images: all but those rejected as ``NOT_IMAGES`` say."""
        not_images = sum(self.rejected_by_reason.get(reason, 0) for reason in NOT_IMAGES)
        return max(self.manifest.counts.input - not_images, 0)

    @property
    def images_per_s(self) -> float:
        """Images (``images``) through the image step per second of the whole run."""
        return self.images / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def top_reasons(self, n: int = TOP_REASONS) -> list[tuple[str, int]]:
        """The ``n`` most frequent rejection reasons, most frequent first."""
        return sorted(self.rejected_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def class_counts(self) -> dict[str, dict[str, int]]:
        """``{split: {class name: examples}}`` for the splits that record them."""
        return {
            name: dict(split.class_counts)
            for name, split in sorted(self.manifest.splits.items())
            if split.class_counts is not None
        }

    def describe(self) -> str:
        """A human-readable summary: counts, rate, reasons, conflicts, classes and verdict."""
        m = self.manifest
        c = m.counts
        path = lambda name: FileSystems.join(self.output, name)  # noqa: E731
        images = "" if self.images == c.input else f" ({plural(self.images, 'image')})"
        lines = [
            f"{plural(c.input, 'input')}{images} in {self.elapsed_s:.1f} s "
            f"({self.images_per_s:.1f} images/s): {c.written} written, {c.rejected} rejected, "
            f"{plural(c.duplicates, 'duplicate')}"
        ]
        if m.lineage is not None:  # a --base build
            reused, prepared = m.lineage.get("reused", 0), m.lineage.get("prepared", 0)
            lines.append(
                f"--base: reused {plural(reused, 'example')} from the base (stored bytes, not "
                f"decoded again), prepared {prepared}"
            )
        if self.reused_from_staging is not None:
            prepared = self.metrics.get("images_prepared", 0)
            lines.append(
                f"--resume: reused {plural(self.reused_from_staging, 'prepared image')} from "
                f"staging (not read or decoded again), prepared {prepared}"
            )
        if c.skipped:
            root = str(m.options.get("input", ""))
            examples = ", ".join(_relative_to_input(p, root) for p in self.skipped_examples)
            lines.append(
                f"skipped {plural(c.skipped, 'hidden or system file')} (not inputs): {examples}"
                + (" …" if c.skipped > len(self.skipped_examples) else "")
            )
        limit = m.options.get("max_bad_fraction", 0.0)
        no_label = self.rejected_by_reason.get("no_label", 0)
        lines.append(
            f"bad fraction {self.bad_fraction:.2%} (limit {limit:.2%})"
            + (
                f"; {plural(no_label, 'file')} outside any class folder (no_label) not counted"
                if no_label
                else ""
            )
        )
        lines.extend(self._size_lines())
        if self.rejected_by_reason:
            top = ", ".join(f"{k} {v}" for k, v in self.top_reasons())
            more = len(self.rejected_by_reason) - TOP_REASONS
            lines.append(f"top rejection reasons: {top}" + (f" (+{more} more)" if more > 0 else ""))
        if self.label_conflicts:
            policy = m.options.get("label_conflicts", "keep_first")
            action = {
                "keep_first": "kept the first copy of each",
                "drop_both": "dropped every copy",
                "fail": "the dataset is not published",
            }[policy]
            lines.append(
                f"label conflicts: {len(self.label_conflicts)} (the same bytes under different "
                f"classes; --label_conflicts {policy}: {action}), see {path(DUPLICATES_NAME)}"
            )
            for group in self.label_conflicts[:_CONFLICTS_SHOWN]:
                lines.append(
                    "  " + " = ".join(f"{uri} ({label})" for uri, label in group["copies"])
                )
            if len(self.label_conflicts) > _CONFLICTS_SHOWN:
                lines.append(f"  … {len(self.label_conflicts) - _CONFLICTS_SHOWN} more")
        lines.extend(summary_lines(self.near_duplicates, self.output))
        lines.extend(self._class_table())
        shards = m.all_shards()
        if shards:
            lines.append(
                f"shards: {path(shards[0].file)}"
                + (f" … {shards[-1].file} ({len(shards)} files)" if len(shards) > 1 else "")
            )
        lines.append(self._reports_line())
        if self.published:
            lines.append(f"published: {path(MANIFEST_NAME)}")
        else:
            lines.extend(f"NOT published: {reason}" for reason in self.not_published_because)
        return "\n".join(lines)

    def _reports_line(self) -> str:
        """The reports that hold a line. Both are always written (the tools read them), but
        an empty one is not worth a look."""
        c = self.manifest.counts
        listed = [(REJECTED_NAME, c.rejected), (DUPLICATES_NAME, c.duplicates)]
        reports = ", ".join(FileSystems.join(self.output, name) for name, n in listed if n)
        return f"reports: {reports or '(none: no file rejected, no duplicate)'}"

    @property
    def upscaled(self) -> int:
        """Examples stored larger than their source, as ``dataset.json`` counts them: every
        written example, those a ``--resume`` or ``--base`` build did not prepare again too."""
        counted = self.manifest.counts.upscaled
        return int(self.metrics.get("upscaled", 0)) if counted is None else counted

    def _size_lines(self) -> list[str]:
        """What happened to sources smaller than the stored size: upscaled, or too small."""
        too_small = self.rejected_by_reason.get("too_small", 0)
        lines = []
        if self.upscaled:
            lines.append(
                f"upscaled: {plural(self.upscaled, 'image')} stored larger than the source "
                f"(shorter side below --image_size {self.manifest.image.image_size})"
            )
        if too_small:
            lines.append(
                f"too small: {plural(too_small, 'image')} with a shorter side below "
                "--min_source_side rejected (--small_images keep or upscale stores them)"
            )
        return lines

    def _class_table(self) -> list[str]:
        m = self.manifest
        splits = sorted(m.splits)
        counts = self.class_counts()
        if not m.label_names or set(counts) != set(splits):
            names = ", ".join(map(display_label, m.label_names))
            return [f"classes ({len(m.label_names)}): {names}"] + [
                f"{name}: {plural(m.splits[name].num_examples, 'example')} in "
                f"{plural(len(m.splits[name].shards), 'shard')}"
                for name in splits
            ]
        # Long class names are kept whole in the data; the table shows them shortened.
        width = max(len("class"), *(len(display_label(n)) for n in m.label_names))
        cols = [max(len(s), 8) for s in splits]
        row = lambda first, cells: "  ".join(  # noqa: E731
            [first.ljust(width)] + [str(v).rjust(w) for v, w in zip(cells, cols, strict=True)]
        )
        lines = [row("class", splits)]
        shown: list[str | None] = list(m.label_names)
        if len(shown) > CLASSES_IN_FULL:
            # The classes a reader checks first: the smallest and the largest, by examples.
            by_size = sorted(m.label_names, key=lambda n: (sum(counts[s][n] for s in splits), n))
            shown = [*by_size[:CLASSES_AT_EACH_END], None, *by_size[-CLASSES_AT_EACH_END:]]
            lines[0] += "  (the smallest and the largest classes)"
        between = len(m.label_names) - 2 * CLASSES_AT_EACH_END
        lines += [
            row(display_label(n), [counts[s][n] for s in splits])
            if n
            else f"… {between} classes between them (every count: class_counts in {MANIFEST_NAME})"
            for n in shown
        ]
        lines.append(row("total", [m.splits[s].num_examples for s in splits]))
        lines.append(row("shards", [len(m.splits[s].shards) for s in splits]))
        return lines

    def to_dict(self) -> dict[str, Any]:
        """Everything in ``describe``, for ``--json``."""
        m = self.manifest
        return {
            "output": self.output,
            "published": self.published,
            "not_published_because": list(self.not_published_because),
            "elapsed_s": round(self.elapsed_s, 3),
            "images": self.images,
            "images_per_s": round(self.images_per_s, 3),
            "counts": m.counts.to_dict(),
            "bad_fraction": self.bad_fraction,
            "max_bad_fraction": m.options.get("max_bad_fraction"),
            "rejected_by_reason": dict(self.rejected_by_reason),
            "upscaled": self.upscaled,
            "skipped_examples": list(self.skipped_examples),
            "label_conflicts": list(self.label_conflicts),
            "label_names": list(m.label_names),
            "splits": {
                name: {
                    "num_examples": split.num_examples,
                    "num_shards": len(split.shards),
                    "class_counts": (
                        dict(split.class_counts) if split.class_counts is not None else None
                    ),
                }
                for name, split in sorted(m.splits.items())
            },
            "manifest": FileSystems.join(self.output, MANIFEST_NAME) if self.published else None,
            "metrics": dict(self.metrics),
            "removed": list(self.removed),
            "near_duplicates": self.near_duplicates,
            "reused_from_staging": self.reused_from_staging,
        }
