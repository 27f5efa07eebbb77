"""The pipeline's own configuration, validated once, independent of the Beam runner."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from beam_pipelines.images import ImageOptions

__all__ = ["PipelineConfig", "parse_background"]

_HEX_COLOUR = re.compile(r"^#?([0-9a-fA-F]{6})$")


def parse_background(text: str) -> tuple[int, int, int]:
    """Parses ``#rrggbb`` (or ``rrggbb``) into an RGB tuple.

    Raises:
      ValueError: naming the text and the expected form.
    """
    match = _HEX_COLOUR.match(text.strip())
    if not match:
        raise ValueError(f"background colour must look like '#ffffff', got {text!r}")
    value = match.group(1)
    return (int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """Everything the images -> TFRecord pipeline needs besides the runner.

    Attributes:
      input: a directory/prefix laid out as ``<class>/<file>``, or a ``.csv``/``.jsonl`` listing.
      output: the dataset directory/prefix; ``dataset.json`` is written there last.
      image: how each image is prepared.
      validation_fraction: share of examples (by content hash) put in the ``validation`` split.
      num_shards: shard count for ``train`` (validation gets a proportional count); None to
        derive counts from ``target_shard_mb``.
      target_shard_mb: wanted shard size in MiB when ``num_shards`` is None.
      max_bad_fraction: largest rejected/input ratio that still publishes the dataset.
      overwrite: replace an existing dataset at ``output``.

    Raises:
      ValueError: naming the bad field and value.
    """

    input: str
    output: str
    image: ImageOptions = dataclasses.field(default_factory=ImageOptions)
    validation_fraction: float = 0.0
    num_shards: int | None = None
    target_shard_mb: float = 128.0
    max_bad_fraction: float = 0.01
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.input, str) or not self.input:
            raise ValueError(
                f"--input must name a directory, prefix or listing, got {self.input!r}"
            )
        if not isinstance(self.output, str) or not self.output:
            raise ValueError(f"--output must name a directory or prefix, got {self.output!r}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"--validation_fraction must be in [0, 1), got {self.validation_fraction!r}"
            )
        if self.num_shards is not None and not 1 <= self.num_shards <= 99999:
            raise ValueError(f"--num_shards must be in [1, 99999], got {self.num_shards!r}")
        if not self.target_shard_mb > 0:
            raise ValueError(f"--target_shard_mb must be > 0, got {self.target_shard_mb!r}")
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"--max_bad_fraction must be in [0, 1], got {self.max_bad_fraction!r}")
        out = self.output.rstrip("/")
        if out == self.input.rstrip("/") or out.startswith(self.input.rstrip("/") + "/"):
            raise ValueError(
                f"--output {self.output!r} must not be inside --input {self.input!r}: "
                "a later run would read its own shards as images"
            )

    @property
    def target_shard_bytes(self) -> int:
        return int(self.target_shard_mb * 1024 * 1024)

    def manifest_options(self) -> dict[str, Any]:
        """The options recorded in ``dataset.json``.

        Only what shapes the dataset's content: no output location, no runner, nothing
        machine-specific, so that every runner produces the same manifest.
        """
        return {
            "input": self.input,
            "image_size": self.image.image_size,
            "crop": self.image.crop,
            "encoding": self.image.encoding,
            "jpeg_quality": self.image.jpeg_quality,
            "max_pixels": self.image.max_pixels,
            "background": "#{:02x}{:02x}{:02x}".format(*self.image.background),
            "validation_fraction": self.validation_fraction,
            "num_shards": self.num_shards,
            "target_shard_mb": self.target_shard_mb,
            "max_bad_fraction": self.max_bad_fraction,
        }
