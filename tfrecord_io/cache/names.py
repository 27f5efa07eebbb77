"""Names in the shard cache's marker protocol, in pure Python: no TensorFlow needed.

**A shard's local name** is ``<hash>-<basename>``:

* ``<hash>``: ``tf.strings.to_hash_bucket_strong(uri, HASH_BUCKETS, key=HASH_KEY)`` in decimal,
  that is SipHash-2-4 (TensorFlow's ``StrongKeyedHash`` is highwayhash's ``SipHashState``, keyed
  with two uint64) of the URI's UTF-8 bytes, modulo ``HASH_BUCKETS``;
* ``<basename>``: the URI after its last ``/`` (of its first line), every character outside
  ``[A-Za-z0-9._-]`` replaced by ``_``, cut to ``BASENAME_BYTES`` bytes.

The graph side (``tfrecord_io.cache.handoff.local_name_graph``) computes the same name with
TensorFlow ops inside ``tf.data``; both must agree byte for byte, since the Python side answers
the markers the graph side writes (``tests/test_cache_names.py`` compares them).

One name costs about 35 µs in pure Python (64-bit arithmetic on Python ints); ``local_names``
hashes a long list with numpy (about 3 µs a name, most of it the basename), and ``local_name``
remembers the names it computed, so a reader that opens the same shards every epoch hashes
each once.

**Request ids** of ``CacheClient`` are ``<pid>-<serial>-<token>``: the owner reads the pid
(``requester_pid``) to tell a reader in another process, whose open files it cannot see, from
its own; ``tf.data``'s are 19 digits. **Error markers** hold only text (``tf.data`` shows it as
is); ``NOT_REGISTERED`` and ``INTEGRITY_FAILURE`` are the words in it that tell a client which
error to raise.
"""

from __future__ import annotations

import functools
import os
import re
import struct
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

__all__ = [
    "BASENAME_BYTES",
    "HASH_BUCKETS",
    "HASH_KEY",
    "INTEGRITY_FAILURE",
    "NOT_REGISTERED",
    "client_request_id",
    "local_name",
    "local_names",
    "requester_pid",
    "siphash24",
]

HASH_KEY = (0x7466726563, 0x6F72645F696F)  # fixed: local names must be stable across processes
HASH_BUCKETS = (1 << 62) - 1
BASENAME_BYTES = 80

_MASK = (1 << 64) - 1
# SipHash's initial state constants: "somepseudorandomlygeneratedbytes".
_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)
# Below this many names, numpy's start-up and per-call costs exceed the pure-Python loop.
_VECTOR_MIN = 32
# The same semantics as RE2's in TensorFlow's regex_replace: ``.`` stops at a newline, ``^`` is
# the start of the text only, and a character is a code point.
_DIRECTORY = re.compile(r"^.*/")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _words(data: bytes) -> list[int]:
    """SipHash's message words: 8-byte little-endian words, the last one padded with zeros and
    carrying the length's low byte in its top byte."""
    whole = len(data) - len(data) % 8
    words = list(struct.unpack_from(f"<{whole // 8}Q", data))
    words.append(int.from_bytes(data[whole:], "little") | (len(data) & 0xFF) << 56)
    return words


def siphash24(key: tuple[int, int], data: bytes) -> int:
    """SipHash-2-4 of ``data`` with the 128-bit key ``(k0, k1)`` (two uint64), as a uint64.

    The reference algorithm (Aumasson & Bernstein), with the key's bytes ``k0`` then ``k1``,
    little-endian: what highwayhash's ``SipHash`` computes from ``HH_U64 key[2]``.
    """
    k0, k1 = key
    v0, v1, v2, v3 = k0 ^ _INIT[0], k1 ^ _INIT[1], k0 ^ _INIT[2], k1 ^ _INIT[3]
    m = _MASK
    # Two SipRounds per word, then 0xFF into v2 and four more. One copy of the round, inline:
    # calls cost as much as the arithmetic on Python ints.
    for word, rounds, final in [*((w, 2, 0) for w in _words(data)), (0, 4, 0xFF)]:
        v3 ^= word
        v2 ^= final
        for _ in range(rounds):
            v0 = (v0 + v1) & m
            v1 = ((v1 << 13) & m | v1 >> 51) ^ v0
            v0 = (v0 << 32) & m | v0 >> 32
            v2 = (v2 + v3) & m
            v3 = ((v3 << 16) & m | v3 >> 48) ^ v2
            v0 = (v0 + v3) & m
            v3 = ((v3 << 21) & m | v3 >> 43) ^ v0
            v2 = (v2 + v1) & m
            v1 = ((v1 << 17) & m | v1 >> 47) ^ v2
            v2 = (v2 << 32) & m | v2 >> 32
        v0 ^= word
    return v0 ^ v1 ^ v2 ^ v3


def _siphash24_many(key: tuple[int, int], messages: list[bytes]) -> list[int]:
    """``siphash24`` of each message, computed on numpy uint64 arrays (which wrap like C).

    Messages with the same number of words are hashed together, one column of words at a time.
    """
    import numpy as np

    by_count: dict[int, list[int]] = defaultdict(list)
    for i, data in enumerate(messages):
        by_count[len(data) // 8 + 1].append(i)
    hashes = [0] * len(messages)
    for count, indices in by_count.items():
        # (messages, count) words, each row a message padded as ``_words`` pads it.
        rows = b"".join(
            messages[i].ljust(count * 8 - 1, b"\0") + bytes([len(messages[i]) & 0xFF])
            for i in indices
        )
        words = np.frombuffer(rows, dtype="<u8").reshape(len(indices), count)
        k0, k1 = key
        v = [
            np.full(len(indices), k ^ c, dtype=np.uint64)
            for k, c in zip((k0, k1, k0, k1), _INIT, strict=True)
        ]
        for j in range(count):
            v[3] ^= words[:, j]
            _sip_rounds(v, 2)
            v[0] ^= words[:, j]
        v[2] ^= np.uint64(0xFF)
        _sip_rounds(v, 4)
        for i, value in zip(indices, (v[0] ^ v[1] ^ v[2] ^ v[3]).tolist(), strict=True):
            hashes[i] = value
    return hashes


def _sip_rounds(v: list[Any], n: int) -> None:
    """``n`` SipRounds on the state ``v`` (four numpy uint64 arrays), in place."""

    def rotate(x: Any, bits: int) -> Any:
        return (x << bits) | (x >> (64 - bits))

    for _ in range(n):
        v[0] += v[1]
        v[1] = rotate(v[1], 13) ^ v[0]
        v[0] = rotate(v[0], 32)
        v[2] += v[3]
        v[3] = rotate(v[3], 16) ^ v[2]
        v[0] += v[3]
        v[3] = rotate(v[3], 21) ^ v[0]
        v[2] += v[1]
        v[1] = rotate(v[1], 17) ^ v[2]
        v[2] = rotate(v[2], 32)


def _encode(uri: str) -> bytes:
    if not isinstance(uri, str):
        raise TypeError(f"expected a shard URI as str, got {type(uri).__name__}: {uri!r}")
    try:
        return uri.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"shard URI {uri!r} is not valid Unicode: {e}") from e


def _join(digest: int, uri: str) -> str:
    base = _UNSAFE.sub("_", _DIRECTORY.sub("", uri, count=1))
    # Only ASCII is left, so characters are bytes: the cut is TensorFlow's byte ``substr``.
    return f"{digest % HASH_BUCKETS}-{base[:BASENAME_BYTES]}"


@functools.lru_cache(maxsize=1 << 16)
def local_name(uri: str) -> str:
    """The cache file name of shard ``uri``: the same in every process and on every host.

    Raises:
      TypeError: if ``uri`` is not a str.
      ValueError: if ``uri`` cannot be encoded as UTF-8 (a lone surrogate).
    """
    return _join(siphash24(HASH_KEY, _encode(uri)), uri)


def local_names(uris: Iterable[str]) -> list[str]:
    """``local_name`` of each URI, in order; long lists are hashed with numpy.

    Raises:
      TypeError: if a URI is not a str.
      ValueError: if a URI cannot be encoded as UTF-8.
    """
    uris = list(uris)
    if len(uris) < _VECTOR_MIN:
        return [local_name(uri) for uri in uris]
    digests = _siphash24_many(HASH_KEY, [_encode(uri) for uri in uris])
    return [_join(digest, uri) for digest, uri in zip(digests, uris, strict=True)]


NOT_REGISTERED = "was requested but no shard is registered"
INTEGRITY_FAILURE = "SHA-256 mismatch"


def client_request_id(serial: int, token: str) -> str:
    """A ``CacheClient`` request id, unique on the host: this process's id, a serial number,
    and a random ``token`` (against pid reuse, and pid namespaces sharing a directory)."""
    return f"{os.getpid()}-{serial}-{token}"


def requester_pid(request_id: str) -> int | None:
    """The process id in a ``CacheClient`` request id; None for other ids (``tf.data``'s,
    ``fetch``)."""
    pid, _, rest = request_id.partition("-")
    return int(pid) if rest and pid.isdigit() else None
