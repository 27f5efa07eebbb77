"""The shard cache's configuration, the shards it holds, its errors and its default place.

See ``tfrecord_io.cache`` for how the cache works.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from objstore import GLOB_CHARS, RetryPolicy, is_object_store_uri, redact

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "CacheConfig",
    "CacheDirInUseError",
    "CacheStats",
    "RemoteShard",
    "ShardIntegrityError",
    "default_cache_bytes",
    "default_cache_dir",
]

DEFAULT_CACHE_BYTES = 10 << 30


class CacheDirInUseError(RuntimeError):
    """Another process holds the cache directory."""


class ShardIntegrityError(ValueError):
    """A downloaded shard does not match ``dataset.json`` (SHA-256 or size).

    Attributes:
      uri: the shard's URI.
    """

    def __init__(self, message: str, *, uri: str) -> None:
        super().__init__(redact(message))
        self.uri = uri


@dataclasses.dataclass(frozen=True)
class RemoteShard:
    """A shard to cache: its URI, committed size and SHA-256 (None for foreign shards)."""

    uri: str
    num_bytes: int
    sha256: str | None = None

    def __post_init__(self) -> None:
        if not is_object_store_uri(self.uri):
            raise ValueError(f"expected an s3:// or gs:// shard URI, got {redact(self.uri)!r}")
        if not isinstance(self.num_bytes, int) or self.num_bytes < 0:
            raise ValueError(f"num_bytes of {self.uri} must be an int >= 0, got {self.num_bytes!r}")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """How the shard cache behaves.

    Attributes:
      cache_dir: local directory owned by the cache (created if needed). No glob characters.
      cache_bytes: the most bytes of shard files kept in ``cache_dir``.
      download_ahead: shards announced ahead of the interleave, in read order.
      download_threads: concurrent downloads.
      chunk_bytes: size of each ranged GET; a failed chunk is retried alone.
      pin_s: the longest a shard handed to ``tf.data`` stays protected from eviction when its
        reader neither finishes it nor is seen holding it open (an abandoned iterator).
      wait_timeout_s: how long ``tf.data`` waits for one shard before failing.
      poll_interval_s: how often ``tf.data`` and the scanner look at the marker files.
      retry: retry policy of the object-store calls.
    """

    cache_dir: str
    cache_bytes: int = DEFAULT_CACHE_BYTES
    download_ahead: int = 8
    download_threads: int = 4
    chunk_bytes: int = 8 << 20
    pin_s: float = 60.0
    wait_timeout_s: float = 1800.0
    poll_interval_s: float = 0.005
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.cache_dir, str) or not self.cache_dir:
            raise ValueError(f"cache_dir must be a non-empty path, got {self.cache_dir!r}")
        if "://" in self.cache_dir or GLOB_CHARS & set(self.cache_dir):
            raise ValueError(
                f"cache_dir must be a local path without glob characters {sorted(GLOB_CHARS)}, "
                f"got {self.cache_dir!r}"
            )
        for name in ("cache_bytes", "chunk_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("download_ahead", "download_threads"):
            value = getattr(self, name)
            minimum = 0 if name == "download_ahead" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        for name in ("pin_s", "wait_timeout_s", "poll_interval_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")


@dataclasses.dataclass
class CacheStats:
    """Counters of one cache, for logs, tests and benchmarks."""

    hits: int = 0
    downloads: int = 0
    bytes_downloaded: int = 0
    evictions: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def default_cache_dir(source: str) -> str:
    """The cache directory used for ``source`` when none is given.

    ``$TFRECORD_IO_CACHE_DIR`` (or ``~/.cache/tfrecord_io``) / a hash of the source URI, so that a
    restarted process finds the same directory: an exact resume reopens the same local paths.
    """
    base = os.environ.get("TFRECORD_IO_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "tfrecord_io"
    )
    digest = hashlib.sha256(source.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(base, digest)


def default_cache_bytes() -> int:
    """``$TFRECORD_IO_CACHE_BYTES`` if set, else ``DEFAULT_CACHE_BYTES`` (10 GiB).

    Raises:
      ValueError: if the variable is not a positive integer.
    """
    text = os.environ.get("TFRECORD_IO_CACHE_BYTES")
    if not text:
        return DEFAULT_CACHE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"TFRECORD_IO_CACHE_BYTES must be a positive integer, got {text!r}")
    return value
