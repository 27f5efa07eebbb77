"""Finding duplicate keys across a whole dataset in bounded memory (``verify``'s key check).

A dataset's keys are SHA-256 digests of the source bytes, and no two examples may share one.
Holding every key as a string in a set costs about 150 bytes per example (190 MB for
ImageNet, tens of GB for a billion examples). ``KeyCollector`` keeps 24 bytes per example
instead: the key's first 128 bits as two ``uint64`` and where the record is (shard and record
number as two ``uint32``), appended to compact arrays while the shards are read. At the end it
sorts the fingerprints once (8 more bytes per example for the order) and reports every group
of equal ones.

Two different SHA-256 keys agree on 128 bits with probability 2^-128 per pair, so among a
billion keys a false report has probability about 1e-21. Keys that are not hex digests (shards
adopted from other tools) are fingerprinted with BLAKE2b-128 first.
"""

from __future__ import annotations

import hashlib
from array import array

import numpy as np

__all__ = ["BYTES_PER_EXAMPLE", "KeyCollector"]

BYTES_PER_EXAMPLE = 24  # held while reading; the final sort adds 8
_HEX = frozenset("0123456789abcdef")


class KeyCollector:
    """Collects ``(key, shard, record)`` and finds keys held by more than one record."""

    def __init__(self) -> None:
        self._high = array("Q")
        self._low = array("Q")
        self._shard = array("I")
        self._record = array("I")
        self._shards: list[str] = []

    def __len__(self) -> int:
        return len(self._high)

    @property
    def nbytes(self) -> int:
        """Bytes the collected keys and places hold (``BYTES_PER_EXAMPLE`` each)."""
        arrays = (self._high, self._low, self._shard, self._record)
        return sum(a.itemsize * len(a) for a in arrays)

    def add_shard(self, name: str) -> int:
        """Registers a shard by name; returns its number for ``add``."""
        self._shards.append(name)
        return len(self._shards) - 1

    def add(self, shard: int, record: int, key: str) -> None:
        """Notes that record ``record`` of shard ``shard`` holds ``key``."""
        if len(key) == 64 and _HEX.issuperset(key):
            high, low = int(key[:16], 16), int(key[16:32], 16)
        else:
            digest = hashlib.blake2b(key.encode("utf-8"), digest_size=16).digest()
            high, low = int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:], "big")
        self._high.append(high)
        self._low.append(low)
        self._shard.append(shard)
        self._record.append(record)

    def duplicates(self, *, limit: int = 100) -> list[str]:
        """One line per key held more than once, naming every place it is held.

        Args:
          limit: lines reported at most; a last line counts the rest.
        """
        n = len(self._high)
        if n < 2:
            return []
        high = np.frombuffer(self._high, np.uint64)
        low = np.frombuffer(self._low, np.uint64)
        order = np.lexsort((low, high))
        high, low = high[order], low[order]
        same = (high[1:] == high[:-1]) & (low[1:] == low[:-1])
        if not same.any():
            return []
        # Runs of equal fingerprints: a run starts where one is equal to the next and not to
        # the one before.
        starts = np.flatnonzero(same & ~np.concatenate(([False], same[:-1])))
        shards = np.frombuffer(self._shard, np.uint32)
        records = np.frombuffer(self._record, np.uint32)
        lines = []
        for start in starts[:limit]:
            end = start + 1
            while end < n and high[end] == high[start] and low[end] == low[start]:
                end += 1
            places = sorted(
                (int(shards[order[i]]), int(records[order[i]])) for i in range(start, end)
            )
            where = " and ".join(f"{self._shards[s]} (record {r})" for s, r in places)
            key = f"{int(high[start]):016x}{int(low[start]):016x}"
            lines.append(f"key {key}… appears {end - start} times: in {where}")
        if len(starts) > limit:
            lines.append(f"... and {len(starts) - limit} more duplicated keys")
        return lines
