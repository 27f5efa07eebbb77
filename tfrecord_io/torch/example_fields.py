"""The three features the torch loader needs, read from a serialised ``tf.train.Example`` in
place: the stored image as a view of the record's bytes, not a copy.

protobuf's Python API copies every bytes field it hands out, and parses every feature: for a
RAW 224 px example that is three copies of 150 KB (about 30 us) per record. This reads the
protobuf wire format of ``Example`` (``features`` = 1) -> ``Features`` (``feature`` = 1, a map
entry of ``key`` = 1 and ``value`` = 2) -> ``Feature`` (``bytes_list`` = 1, ``int64_list`` = 3)
-> the list's ``value`` = 1 (int64 packed or not), skipping every other field by its wire
type, as any protobuf parser must. A message it cannot read the simple way (a repeated
``features`` field, which protobuf merges; a feature listed twice; a map key that is not
UTF-8) goes to protobuf itself, so wherever protobuf parses a message both give the same
answer or the same refusal (``tests/test_torch_example_fields.py`` checks this on random and
damaged messages). The features it does not need are skipped by length, not parsed: damage
inside one of them, which protobuf would refuse, goes unseen (a record reaches this only after
its CRCs pass, so such damage can only come from its writer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

__all__ = ["ParsedFields", "read_fields"]

_LENGTH = 2  # wire type of length-delimited fields
_WANTED = {b"image/encoded": 0, b"image/class/label": 1, b"image/key/sha256": 2}


class _Fallback(Exception):
    """The message needs protobuf's own parser (merged fields, or bytes it refuses)."""


ParsedFields = tuple[memoryview | bytes, int, str]


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Fallback
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:  # a varint longer than 64 bits keeps its low 64, as protobuf's does
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7


def _skip(data: bytes, pos: int, end: int, wire: int) -> int:
    if wire == 0:
        return _varint(data, pos, end)[1]
    if wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    elif wire == _LENGTH:
        size, pos = _varint(data, pos, end)
        pos += size
    else:
        raise _Fallback
    if pos > end:
        raise _Fallback
    return pos


def _fields(data: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field, wire, start, stop)`` of each field of the message in ``data[pos:end]``; for a
    length-delimited field, ``[start, stop)`` is its content."""
    while pos < end:
        tag, pos = _varint(data, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 0:
            raise _Fallback
        if wire == _LENGTH:
            size, start = _varint(data, pos, end)
            pos = start + size
            if pos > end:
                raise _Fallback
            yield field, wire, start, pos
        else:
            start = pos
            pos = _skip(data, pos, end, wire)
            yield field, wire, start, pos


def _only(
    data: bytes, start: int, end: int, field: int, rivals: tuple[int, ...] = ()
) -> tuple[int, int]:
    """The content of the one length-delimited ``field`` of a message (the ``value`` of a
    ``BytesList``; with ``rivals``, the other members of a ``Feature``'s one-of, none of which
    may appear); other fields are ignored, as protobuf ignores unknown fields."""
    found = None
    for number, wire, a, b in _fields(data, start, end):
        if number in rivals:
            raise _Fallback
        if number == field:
            if wire != _LENGTH or found is not None:
                raise _Fallback
            found = (a, b)
    if found is None:
        raise _Fallback
    return found


def _int64s(data: bytes, start: int, end: int) -> list[int]:
    """The values of an ``Int64List`` (packed, or one varint per field)."""
    values = []
    for number, wire, a, b in _fields(data, start, end):
        if number != 1:
            continue
        if wire == 0:
            values.append(_varint(data, a, b)[0])
        elif wire == _LENGTH:
            pos = a
            while pos < b:
                value, pos = _varint(data, pos, b)
                values.append(value)
        else:
            raise _Fallback
    return [v - (1 << 64) if v >= 1 << 63 else v for v in values]


def _scan(data: bytes, start: int, end: int, with_key: bool) -> ParsedFields:
    features = [(a, b, w) for number, w, a, b in _fields(data, start, end) if number == 1]
    if len(features) != 1 or features[0][2] != _LENGTH:
        raise _Fallback
    found: list[tuple[int, int] | None] = [None, None, None]
    for number, wire, a, b in _fields(data, features[0][0], features[0][1]):
        if number != 1:
            continue
        if wire != _LENGTH:
            raise _Fallback
        key = value = None
        for field, kind, c, d in _fields(data, a, b):
            if field in (1, 2) and (kind != _LENGTH or (key, value)[field - 1] is not None):
                raise _Fallback
            if field == 1:
                key = data[c:d]
            elif field == 2:
                value = (c, d)
        if key is not None:
            key.decode()  # protobuf refuses a map key (a proto3 string) that is not UTF-8
        slot = _WANTED.get(key) if key is not None else None
        if slot is not None:
            if found[slot] is not None or value is None:
                raise _Fallback
            found[slot] = value
    image, label, sha = found
    if image is None or label is None:
        raise _Fallback
    bytes_start, bytes_end = _only(data, *_only(data, *image, 1, rivals=(2, 3)), 1)
    labels = _int64s(data, *_only(data, *label, 3, rivals=(1, 2)))
    if len(labels) != 1:
        raise _Fallback
    text = ""
    if with_key and sha is not None:
        a, b = _only(data, *_only(data, *sha, 1, rivals=(2, 3)), 1)
        text = data[a:b].decode()
    return memoryview(data)[bytes_start:bytes_end], labels[0], text


def read_fields(
    data: bytes, start: int, end: int, *, with_key: bool, parse: Callable[..., ParsedFields]
) -> ParsedFields:
    """``(image bytes, label, key)`` of a serialised example: the image a view of ``data``.

    Args:
      data, start, end: the serialised ``tf.train.Example`` is ``data[start:end]`` (a record's
        payload inside its frame).
      with_key: also read ``image/key/sha256`` ("" otherwise, or when absent).
      parse: protobuf's parse, ``(payload, *, with_key) -> ParsedFields``, for what this cannot
        read the simple way.

    Raises:
      ValueError: from ``parse``, if the message is not an example with one image and one label.
    """
    try:
        return _scan(data, start, end, with_key)
    except (_Fallback, UnicodeDecodeError):
        return parse(memoryview(data)[start:end], with_key=with_key)
