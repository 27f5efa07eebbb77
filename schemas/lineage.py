"""What relates one dataset version to another: image options, versions and the ``latest`` pointer.

* ``image_options``: the manifest options that decide the stored example for a given source file.
  Two datasets whose image options are equal store byte-identical images for the same source
  bytes, so an incremental build may reuse the older one's examples (``--base``) and ``diff``
  can say whether a difference in stored bytes is expected.
* Versions side by side: ``DST/v0001/``, ``DST/v0002/``… each a complete dataset, and a small
  text file ``DST/latest`` naming the current one, written last (after the version's
  ``dataset.json``), so a reader that follows it always finds a published dataset.

Storage-agnostic, like ``schemas.manifest``: callers read and write the bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "LATEST_NAME",
    "NON_IMAGE_OPTIONS",
    "image_options",
    "describe_option_changes",
    "version_name",
    "parse_version_name",
    "format_latest_pointer",
    "parse_latest_pointer",
]

LATEST_NAME = "latest"
# Manifest options that never change an example's stored bytes, nor whether its source is
# accepted: where the inputs are listed, how examples are split and sharded, the publishing
# threshold, and which of two identical files is kept. The near-duplicate options belong here
# too: the search reads each example's perceptual hash (decided, like its stored bytes, by
# the source and the image options), and its result only reports pairs or, with ``leakage
# move_to_train``, places an example in train instead of validation. Every other option
# (image size, crop, encoding, quality, colour handling, bounds, small images, accepted
# formats, the image library's version, and any option added later) counts as an image
# option, so that an unknown option turns reuse off rather than on.
NON_IMAGE_OPTIONS = frozenset(
    {
        "input",
        "validation_fraction",
        "stratify_validation",
        "split_rule",
        "num_shards",
        "target_shard_mb",
        "max_bad_fraction",
        "label_conflicts",
        "leakage",
        "near_duplicate_threshold",
        "near_duplicate_window_threshold",
        "near_duplicate_search",
    }
)
_VERSION_RE = re.compile(r"^v(\d{4,})$")
_POINTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def image_options(options: Mapping[str, Any], *, tool_version: str | None = None) -> dict[str, Any]:
    """The image options of a manifest's ``options``: all but ``NON_IMAGE_OPTIONS``.

    ``jpeg_quality`` counts only for the ``jpeg`` encoding. ``tool_version``, when given, is
    included: a new release of the tool may prepare pixels differently.
    """
    chosen = {key: value for key, value in options.items() if key not in NON_IMAGE_OPTIONS}
    if chosen.get("encoding") != "jpeg":
        chosen.pop("jpeg_quality", None)
    if tool_version is not None:
        chosen["tool_version"] = tool_version
    return chosen


def describe_option_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """``"image_size 256 -> 224, crop none -> center"``, or ``""`` when nothing differs."""
    changes = [
        f"{key} {old.get(key)} -> {new.get(key)}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]
    return ", ".join(changes)


def version_name(number: int) -> str:
    """``v0001`` for 1: the directory of a dataset version.

    Raises:
      ValueError: if ``number`` is not a positive int.
    """
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise ValueError(f"a version number must be an int >= 1, got {number!r}")
    return f"v{number:04d}"


def parse_version_name(name: str) -> int | None:
    """The number of a version directory name (``v0002`` -> 2), or None for other names."""
    match = _VERSION_RE.match(name)
    return int(match.group(1)) if match else None


def format_latest_pointer(version: str) -> str:
    """The text of a ``latest`` pointer naming ``version`` (a directory beside the pointer).

    Raises:
      ValueError: if ``version`` is not a plain directory name.
    """
    if not isinstance(version, str) or not _POINTER_RE.match(version):
        raise ValueError(
            f"a latest pointer names a directory beside it, like 'v0002', got {version!r}"
        )
    return version + "\n"


def parse_latest_pointer(text: str | bytes, *, name: str = LATEST_NAME) -> str:
    """The version directory a ``latest`` pointer names.

    Raises:
      ValueError: if the pointer is empty or names anything but a plain directory beside it
        (naming ``name`` and what it holds).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}: not UTF-8 text ({e})") from e
    version = text.strip()
    if not _POINTER_RE.match(version) or len(text) > 256:
        raise ValueError(
            f"{name}: a latest pointer holds one directory name like 'v0002', got {text[:80]!r}"
        )
    return version
