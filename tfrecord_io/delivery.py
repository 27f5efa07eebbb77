"""The data position as a set: which examples of the current epoch were already trained on.

A split's examples have global indices ``0..N-1`` (shard order from ``dataset.json``, then
record order; the catalog's ``index`` column), so the position inside an epoch does not have
to be an iterator's state, which only the topology that wrote it can restore. It can be the
set of indices already trained on: a bitmap of 1 bit per example, plus the epoch and the seed.
That set is the same whatever produced the batches (one worker or many, in-process or on the
tf.data service), and a reader given it (``make_dataset(..., exclude=delivered)``) yields only
the rest of the epoch, on any number of input pipelines.

* ``DeliveredSet`` is the immutable value: what the reader's ``exclude=`` takes.
* ``DeliveryTracker`` is the mutable record a training loop keeps. It is a
  ``tf.train.experimental.PythonState``, so it goes into the same ``tf.train.Checkpoint`` as
  the model and optimiser and is committed with them.

Readers built with ``exclude=`` also yield each example's *position*: one int64,
``epoch * N + index``. ``DeliveryTracker.add`` takes a batch of positions (gathered over all
workers); ``decode_positions`` splits them.

Batches can hold the last examples of one epoch and the first of the next, so the tracker
keeps, beside the bitmap of the current epoch, the positions already trained on in later
epochs (``later``): at most about a global batch with the in-process reader.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from schemas.shard_table import split_digest

if TYPE_CHECKING:
    from schemas import ShardInfo
    from schemas.shard_table import ShardTable

__all__ = [
    "AddResult",
    "DeliveredSet",
    "DeliveryTracker",
    "decode_positions",
    "manifest_split_digest",
    "split_digest",
]

_log = logging.getLogger(__name__)

_MAGIC = b"TFRDLV1\n"
_HEADER = struct.Struct("<I")  # length of the JSON header that follows


# Shard-table rows hashed at a time by ``manifest_split_digest`` (bounded Arrow buffers).
_DIGEST_ROWS = 65_536


def manifest_split_digest(shards: Sequence[ShardInfo]) -> str:
    """``split_digest`` of a manifest split's shards (``SplitInfo.shards``), the same value.

    A shard table (format version 2) is hashed from its ``file`` and ``num_examples`` columns
    in Arrow, a block of rows at a time, so a split of 400 k shards costs no Python object per
    shard; inline entries (format version 1) are already objects.

    Raises:
      FileNotFoundError, ValueError: as ``ShardTable.column``, if the split's shard table is
        missing or damaged.
    """
    from schemas import TableShards

    if isinstance(shards, TableShards):
        from schemas.shard_table import ShardTable  # pyarrow only for shard tables

        if isinstance(shards, ShardTable):
            return _table_digest(shards)
    return split_digest((s.file, s.num_examples) for s in shards)


def _table_digest(table: ShardTable) -> str:
    """``split_digest``'s text, ``"<name>:<count>"`` lines joined by newlines, built and hashed
    in Arrow: each row becomes ``"<name>:<count>\n"`` and the last newline is left out."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = table.columns(["file", "num_examples"])
    digest = hashlib.sha256()
    first = True
    for batch in columns.to_batches(max_chunksize=_DIGEST_ROWS):
        if not batch.num_rows:
            continue
        names = batch.column(0)
        # path.rstrip("/").rsplit("/", 1)[-1], with (?s) so that "." also matches a newline;
        # skipped when no name has a "/" (the pipeline's names), as the regex costs 0.2 s.
        if pc.any(pc.match_substring(names, "/")).as_py():
            names = pc.replace_substring_regex(
                pc.utf8_rtrim(names, characters="/"), pattern="(?s)^.*/", replacement=""
            )
        counts = pc.cast(batch.column(1), pa.string())
        lines = pc.binary_join_element_wise(names, counts, ":")
        lines = pc.binary_join_element_wise(lines, pa.scalar("", pa.string()), "\n")
        # A fresh string array: its rows are the data buffer's bytes, back to back.
        offsets = np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1, lines.offset * 4)
        data = memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]]
        if not first:
            digest.update(b"\n")
        digest.update(data[:-1])
        first = False
    return digest.hexdigest()[:32]


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def decode_positions(positions: Any, num_examples: int) -> tuple[np.ndarray, np.ndarray]:
    """Splits reader positions (``epoch * num_examples + index``) into ``(epochs, indices)``."""
    values = np.asarray(positions, dtype=np.int64).reshape(-1)
    return values // num_examples, values % num_examples


@dataclasses.dataclass(frozen=True)
class DeliveredSet:
    """Which examples of a split were trained on in the current epoch (an immutable value).

    Attributes:
      num_examples: N, the examples in the split.
      epoch: the current epoch (0-based): the lowest one not yet complete.
      seed: the seed of the run that trained on them (recorded; the reader's own ``seed``
        orders what is left).
      bits: the bitmap, ``ceil(N / 8)`` bytes; bit ``i % 8`` of byte ``i // 8`` is example i.
      later: positions (``epoch * N + index``) already trained on in later epochs, sorted.
      split: ``split_digest`` of the split, or None (unchecked).

    Raises:
      ValueError: naming the bad value, if an attribute is invalid.
    """

    num_examples: int
    epoch: int = 0
    seed: int = 0
    bits: bytes = b""
    later: tuple[int, ...] = ()
    split: str | None = None

    def __post_init__(self) -> None:
        _check_int("num_examples", self.num_examples, 1)
        _check_int("epoch", self.epoch, 0)
        _check_int("seed", self.seed, 0)
        size = (self.num_examples + 7) // 8
        if not self.bits:
            object.__setattr__(self, "bits", bytes(size))
        if not isinstance(self.bits, bytes) or len(self.bits) != size:
            raise ValueError(
                f"bits must be {size} bytes for {self.num_examples} examples, got "
                f"{type(self.bits).__name__} of {len(self.bits)}"
            )
        if self.num_examples % 8 and self.bits[-1] >> (self.num_examples % 8):
            raise ValueError(f"bits marks examples beyond num_examples={self.num_examples}")
        later = tuple(sorted(int(p) for p in self.later))
        first = (self.epoch + 1) * self.num_examples
        if later and (later[0] < first or len(set(later)) != len(later)):
            raise ValueError(
                f"later must hold distinct positions of epochs after {self.epoch} "
                f"(>= {first}), got {later[:8]}"
            )
        object.__setattr__(self, "later", later)
        if self.split is not None and not isinstance(self.split, str):
            raise ValueError(f"split must be a split_digest string or None, got {self.split!r}")

    @classmethod
    def empty(
        cls, num_examples: int, *, seed: int = 0, epoch: int = 0, split: str | None = None
    ) -> DeliveredSet:
        """Nothing delivered yet in ``epoch``."""
        return cls(num_examples=num_examples, epoch=epoch, seed=seed, split=split)

    @classmethod
    def from_indices(
        cls,
        num_examples: int,
        indices: Iterable[int],
        *,
        seed: int = 0,
        epoch: int = 0,
        split: str | None = None,
    ) -> DeliveredSet:
        """The set of ``indices`` delivered in ``epoch``.

        Raises:
          ValueError: if an index is outside ``[0, num_examples)``.
        """
        mask = np.zeros(num_examples, dtype=bool)
        values = np.fromiter((int(i) for i in indices), dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= num_examples):
            raise ValueError(f"indices must be in [0, {num_examples}), got {values.min()}..")
        mask[values] = True
        return cls(num_examples, epoch, seed, _pack(mask), (), split)

    @property
    def mask(self) -> np.ndarray:
        """``[N]`` bool: which examples of the current epoch were delivered."""
        return np.unpackbits(
            np.frombuffer(self.bits, np.uint8), count=self.num_examples, bitorder="little"
        ).astype(bool)

    @property
    def count(self) -> int:
        """Examples of the current epoch delivered."""
        return int(np.unpackbits(np.frombuffer(self.bits, np.uint8)).sum())

    @property
    def remaining(self) -> int:
        """Examples of the current epoch still to deliver."""
        return self.num_examples - self.count

    def partial_epochs(self) -> list[tuple[int, np.ndarray]]:
        """``[(epoch, mask)]`` for the current epoch and every later one already begun.

        Epochs between them that nothing was taken from are included with empty masks, so
        the list is consecutive; what follows it are full epochs.
        """
        out = [(self.epoch, self.mask)]
        if not self.later:
            return out
        epochs, indices = decode_positions(self.later, self.num_examples)
        for epoch in range(self.epoch + 1, int(epochs.max()) + 1):
            mask = np.zeros(self.num_examples, dtype=bool)
            mask[indices[epochs == epoch]] = True
            out.append((epoch, mask))
        return out

    def digest(self) -> str:
        """A short digest of the whole value (it names the value's file in a run directory)."""
        return hashlib.sha256(self.to_bytes()).hexdigest()[:16]

    def to_bytes(self, meta: Mapping[str, Any] | None = None) -> bytes:
        """Serialises the set (and a JSON-able ``meta``): N/8 bytes plus a small header."""
        header = {
            "num_examples": self.num_examples,
            "epoch": self.epoch,
            "seed": self.seed,
            "split": self.split,
            "later": len(self.later),
            "meta": dict(meta or {}),
        }
        text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        later = np.asarray(self.later, dtype="<i8").tobytes()
        return b"".join([_MAGIC, _HEADER.pack(len(text)), text, self.bits, later])

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[DeliveredSet, dict[str, Any]]:
        """Parses ``to_bytes`` output; returns the set and its ``meta``.

        Raises:
          ValueError: if ``data`` is not a serialised delivered set.
        """
        if not data.startswith(_MAGIC):
            raise ValueError("not a serialised DeliveredSet (bad magic)")
        offset = len(_MAGIC)
        try:
            (length,) = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            header = json.loads(data[offset : offset + length])
            offset += length
            size = (int(header["num_examples"]) + 7) // 8
            bits = bytes(data[offset : offset + size])
            offset += size
            later = np.frombuffer(data[offset : offset + 8 * int(header["later"])], "<i8")
            value = cls(
                num_examples=int(header["num_examples"]),
                epoch=int(header["epoch"]),
                seed=int(header["seed"]),
                bits=bits,
                later=tuple(int(p) for p in later),
                split=header["split"],
            )
        except (KeyError, TypeError, struct.error, json.JSONDecodeError) as e:
            raise ValueError(f"damaged serialised DeliveredSet: {e}") from e
        return value, dict(header.get("meta") or {})


def _pack(mask: np.ndarray) -> bytes:
    return np.packbits(mask.astype(bool), bitorder="little").tobytes()


@dataclasses.dataclass(frozen=True)
class AddResult:
    """What one ``DeliveryTracker.add`` found.

    Attributes:
      added: positions newly recorded.
      duplicates: positions already recorded (the same example twice in one epoch).
      stale: positions of epochs already closed.
      completed: epochs completed by this batch, each with the examples it never got
        (0 unless an epoch was closed early, see ``DeliveryTracker``).
    """

    added: int
    duplicates: int
    stale: int
    completed: tuple[tuple[int, int], ...]


class DeliveryTracker(tf.train.experimental.PythonState):
    """The delivered set of a training run, kept in its ``tf.train.Checkpoint``.

    Add the positions of every batch trained on (from all workers) after the step; save the
    checkpoint as usual; after a restore, ``delivered`` is what the reader's ``exclude=``
    takes.

    An epoch is complete when all N examples are in. It is closed early, with a warning
    naming how many examples it never got, when positions from two epochs later arrive:
    examples a damaged shard (``skip_corrupt``) or a lost tf.data service worker dropped
    will not come any more.

    Args:
      initial: the starting set (``DeliveredSet.empty(N, seed=...)`` for a fresh run).
      meta: JSON-able data saved with the set (a training loop keeps its resume bookkeeping
        there).
    """

    def __init__(self, initial: DeliveredSet, meta: Mapping[str, Any] | None = None) -> None:
        if not isinstance(initial, DeliveredSet):
            raise TypeError(f"initial must be a DeliveredSet, got {type(initial).__name__}")
        self.meta: dict[str, Any] = dict(meta or {})
        self._set(initial)

    def _set(self, value: DeliveredSet) -> None:
        self._value = value
        self._mask = value.mask
        self._count = int(self._mask.sum())
        self._later = set(value.later)

    @property
    def num_examples(self) -> int:
        return self._value.num_examples

    @property
    def epoch(self) -> int:
        return self._value.epoch

    @property
    def count(self) -> int:
        """Examples of the current epoch delivered."""
        return self._count

    @property
    def delivered(self) -> DeliveredSet:
        """The current value (a snapshot: later ``add`` calls do not change it)."""
        return dataclasses.replace(
            self._value, bits=_pack(self._mask), later=tuple(sorted(self._later))
        )

    def add(self, positions: Any) -> AddResult:
        """Records a batch of positions (``epoch * N + index``) trained on.

        Raises:
          ValueError: if a position is negative.
        """
        n = self.num_examples
        values = np.asarray(positions, dtype=np.int64).reshape(-1)
        if values.size and values.min() < 0:
            raise ValueError(f"positions must be >= 0, got {values.min()}")
        epochs, indices = values // n, values % n
        current = self._value.epoch
        stale = int((epochs < current).sum())
        here = indices[epochs == current]
        unique, counts = np.unique(here, return_counts=True)
        duplicates = int((counts - 1).sum()) + int(self._mask[unique].sum())
        fresh = unique[~self._mask[unique]]
        self._mask[fresh] = True
        self._count += int(fresh.size)
        added = int(fresh.size)
        for value in values[epochs > current].tolist():
            if value in self._later:
                duplicates += 1
            else:
                self._later.add(value)
                added += 1
        completed = []
        while self._count == n or any(p >= (self._value.epoch + 2) * n for p in self._later):
            completed.append((self._value.epoch, n - self._count))
            if self._count < n:
                _log.warning(
                    "epoch %d closed with %d of its %d examples never delivered: examples of "
                    "epoch %d arrived first (a damaged shard skipped, or a lost tf.data "
                    "service worker)",
                    self._value.epoch,
                    n - self._count,
                    n,
                    self._value.epoch + 2,
                )
            self._roll()
        return AddResult(added, duplicates, stale, tuple(completed))

    def _roll(self) -> None:
        """Moves to the next epoch: its bitmap starts from the positions already taken."""
        n, epoch = self.num_examples, self._value.epoch + 1
        start, end = epoch * n, (epoch + 1) * n
        mask = np.zeros(n, dtype=bool)
        mine = [p for p in self._later if start <= p < end]
        mask[np.asarray(mine, dtype=np.int64) - start] = True
        self._later -= set(mine)
        # The value's own ``later`` is stale (the tracker keeps them in ``_later``).
        self._value = dataclasses.replace(self._value, epoch=epoch, bits=b"", later=())
        self._mask = mask
        self._count = int(mask.sum())

    def reset(self, value: DeliveredSet, meta: Mapping[str, Any] | None = None) -> None:
        """Replaces the state (and, if given, ``meta``)."""
        if not isinstance(value, DeliveredSet):
            raise TypeError(f"value must be a DeliveredSet, got {type(value).__name__}")
        self._set(value)
        if meta is not None:
            self.meta = dict(meta)

    # tf.train.experimental.PythonState
    def serialize(self) -> bytes:
        return self.delivered.to_bytes(self.meta)

    def deserialize(self, string_value: Any) -> None:
        data = string_value.numpy() if hasattr(string_value, "numpy") else string_value
        value, meta = DeliveredSet.from_bytes(bytes(data))
        self._set(value)
        self.meta = meta
