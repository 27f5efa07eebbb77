"""Object-store URIs: ``scheme://bucket/key`` parsing and joining, and glob characters."""

from __future__ import annotations

from objstore.redaction import redact

__all__ = ["GLOB_CHARS", "SCHEMES", "has_glob", "is_object_store_uri", "join_uri", "parse_uri"]

SCHEMES = ("s3", "gs")
# The characters that make a path a pattern: the glob metacharacters, and the backslash that
# escapes them in ``tf.io.matching_files``. A path holding none of them names itself wherever it
# is matched (Python's ``glob``, TensorFlow, this package's ``ObjectStore.glob``).
GLOB_CHARS = frozenset("*?[\\")


def has_glob(path: str) -> bool:
    """True if ``path`` holds a glob character (``*``, ``?``, ``[``) or an escaping backslash."""
    return any(c in GLOB_CHARS for c in path)


def parse_uri(uri: str) -> tuple[str, str, str]:
    """Splits ``scheme://bucket/key`` into ``(scheme, bucket, key)``; key may be empty.

    Raises:
      ValueError: if ``uri`` is not an ``s3://`` or ``gs://`` URI with a bucket.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"expected an s3:// or gs:// URI, got {redact(uri)!r}")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"URI {redact(uri)!r} has no bucket name")
    return scheme, bucket, key


def is_object_store_uri(path: str) -> bool:
    """True for ``s3://`` and ``gs://`` URIs."""
    return isinstance(path, str) and path.partition("://")[0] in SCHEMES and "://" in path


def join_uri(root: str, *parts: str) -> str:
    """Joins a URI and ``/``-separated relative parts."""
    out = root.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out
