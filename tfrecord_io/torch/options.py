"""The torch loader's options: ``LoaderConfig``, what ``tfrecord_io.torch.dataset`` takes.

The names are those of ``tfrecord_io.make_dataset`` and ``ReadConfig`` where an option means
the same thing (``global_batch_size``, ``training``, ``image_size``, ``seed``, ``output``,
``with_keys``, ``label_offset``); the rest are what a PyTorch loader adds (``layout``,
``with_index``, ``remainder``, ``window_shards``, ``rank`` and ``world_size``). Each is
checked once, here, with an error naming the value.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any

from tfrecord_io.cache.config import CacheConfig
from tfrecord_io.torch.order import REMAINDERS

__all__ = ["LAYOUTS", "OUTPUTS", "LoaderConfig", "config_from_options", "resolve_topology"]

LAYOUTS = ("CHW", "HWC")
OUTPUTS = ("uint8", "float32")


def _check_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(
            f"{name} must be an int >= {minimum}{' or None' if optional else ''}, got {value!r}"
        )


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How ``tfrecord_io.torch.dataset`` reads a split.

    Attributes:
      global_batch_size: examples per step over all ranks; each rank's batches hold
        ``global_batch_size / world_size`` (it must divide).
      training: window-shuffled epochs, random resized crops and flips, and ``remainder``;
        otherwise one pass in file order with centre crops, every example exactly once, and a
        last short step split over the ranks.
      image_size: output side; None for the side the dataset stores (``dataset.json``).
      seed: the order of every epoch and every crop and flip; the same on every rank (None
        means 0: ranks must agree on the order).
      output: ``"uint8"`` (normalise on the accelerator) or ``"float32"`` normalised with
        ImageNet's mean and standard deviation.
      layout: ``"CHW"`` (what torchvision models take: ``[B, 3, S, S]``, a ``channels_last``
        view of HWC pixels, no copy) or ``"HWC"`` (``[B, S, S, 3]``).
      with_keys: batches also hold each example's ``image/key/sha256`` (a list of str).
      with_index: batches also hold each example's index in the split (int64 ``[B]``), the
        catalog's ``index``: what an audit of exactly-once needs.
      label_offset: subtracted from stored labels.
      remainder: what a training epoch does with the ``N mod global_batch_size`` examples that
        do not fill its last step: ``"carry"`` (default) fills that step with the first
        examples of the next epoch's order, which the next epoch then skips; ``"drop"``
        skips them, as ``drop_last`` does.
      window_shards: training shuffle: shards per window, whose examples are mixed together
        (the cache of a bucket dataset holds about two windows).
      rank, world_size: this process's place among the training processes; None reads
        ``torch.distributed`` when it is initialised, else ``$RANK`` / ``$WORLD_SIZE``, else 0
        and 1.
      shard_cache: the host's shard cache for ``s3://`` and ``gs://`` datasets; None for the
        default directory and size, as ``make_dataset``.

    Raises:
      ValueError: naming the bad value, if any attribute is invalid.
    """

    global_batch_size: int
    training: bool = True
    image_size: int | None = None
    seed: int | None = None
    output: str = "uint8"
    layout: str = "CHW"
    with_keys: bool = False
    with_index: bool = False
    label_offset: int = 0
    remainder: str = "carry"
    window_shards: int = 8
    rank: int | None = None
    world_size: int | None = None
    shard_cache: CacheConfig | None = None

    def __post_init__(self) -> None:
        _check_int("global_batch_size", self.global_batch_size, minimum=1)
        _check_int("image_size", self.image_size, minimum=1, optional=True)
        _check_int("seed", self.seed, minimum=0, optional=True)
        _check_int("label_offset", self.label_offset, minimum=0)
        _check_int("window_shards", self.window_shards, minimum=1)
        _check_int("rank", self.rank, minimum=0, optional=True)
        _check_int("world_size", self.world_size, minimum=1, optional=True)
        for name in ("training", "with_keys", "with_index"):
            _check_bool(name, getattr(self, name))
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {self.output!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.remainder not in REMAINDERS:
            raise ValueError(f"remainder must be one of {REMAINDERS}, got {self.remainder!r}")
        if (self.rank is None) != (self.world_size is None):
            raise ValueError(
                f"pass rank and world_size together or neither, got rank={self.rank!r} and "
                f"world_size={self.world_size!r}"
            )
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"rank must be < world_size, got {self.rank} of {self.world_size}")
        if self.shard_cache is not None and not isinstance(self.shard_cache, CacheConfig):
            raise ValueError(
                f"shard_cache must be a tfrecord_io.CacheConfig or None, got "
                f"{type(self.shard_cache).__name__}"
            )

    @property
    def order_seed(self) -> int:
        return 0 if self.seed is None else self.seed


_FIELDS = tuple(f.name for f in dataclasses.fields(LoaderConfig))


def config_from_options(options: dict[str, Any]) -> LoaderConfig:
    """``LoaderConfig(**options)``, with an error naming a misspelled option and its likely
    intended name.

    Raises:
      TypeError: on an unknown option.
      ValueError: on a bad value.
    """
    for name in options:
        if name not in _FIELDS:
            close = difflib.get_close_matches(name, _FIELDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(
                f"tfrecord_io.torch.dataset got an unknown option {name!r}{hint}; options: "
                f"{', '.join(_FIELDS)}"
            )
    if "global_batch_size" not in options:
        raise TypeError("tfrecord_io.torch.dataset needs global_batch_size=")
    return LoaderConfig(**options)


def resolve_topology(config: LoaderConfig) -> tuple[int, int]:
    """``(rank, world_size)``: the config's, else ``torch.distributed``'s when initialised, else
    ``$RANK`` and ``$WORLD_SIZE`` (as ``torchrun`` sets them), else ``(0, 1)``.

    Raises:
      ValueError: if the global batch does not divide over the ranks, or the environment's
        values are not integers.
    """
    if config.rank is not None and config.world_size is not None:
        rank, world = config.rank, config.world_size
    else:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        else:
            try:
                rank = int(os.environ.get("RANK", "0"))
                world = int(os.environ.get("WORLD_SIZE", "1"))
            except ValueError as e:
                raise ValueError(
                    f"$RANK and $WORLD_SIZE must be integers, got {os.environ.get('RANK')!r} "
                    f"and {os.environ.get('WORLD_SIZE')!r}"
                ) from e
    if config.global_batch_size % world:
        raise ValueError(
            f"global_batch_size={config.global_batch_size} does not divide over "
            f"{world} ranks: pass a multiple of {world}"
        )
    return rank, world
