"""``dataset()``: a split of a published dataset, local or in a bucket, as an ``ImageDataset``."""

from __future__ import annotations

import logging
import os
from typing import Any

from tfrecord_io.torch.dataset import ImageDataset
from tfrecord_io.torch.image import ImageSpec
from tfrecord_io.torch.options import config_from_options, resolve_topology
from tfrecord_io.torch.records import SplitFiles, load_split

__all__ = ["dataset"]

_log = logging.getLogger("tfrecord_io.torch")

# The shard caches this process owns, by directory: they download for every loader (and every
# DataLoader worker and rank) of the host that reads through that directory.
_OWNED_CACHES: dict[str, Any] = {}


def dataset(source: str | os.PathLike[str], split: str = "train", **options: Any) -> ImageDataset:
    """A split of a dataset written by the pipeline, for PyTorch.

    Args:
      source: the dataset's root (or its ``dataset.json``, or a ``latest`` pointer): a local
        path, ``s3://`` or ``gs://``.
      split: the split to read.
      **options: ``LoaderConfig``'s fields; ``global_batch_size`` is required.

    Returns:
      An ``ImageDataset`` yielding ``(images, labels)`` batches (plus keys and indices when
      asked), for ``DataLoader(ds, batch_size=None)``.

    Raises:
      TypeError: on an unknown option (naming the likely intended one).
      ValueError: on a bad option value, a global batch that does not divide over the ranks or
        exceeds the split, or a RAW dataset read at another size than it stores.
      FileNotFoundError: if ``source`` holds no ``dataset.json``.
      KeyError: if the dataset has no such split.
    """
    config = config_from_options(options)
    rank, world = resolve_topology(config)
    files, manifest = load_split(source, split)
    stored = manifest.image
    size = config.image_size or stored.image_size
    if size != stored.image_size:
        level = logging.WARNING if size > stored.image_size else logging.INFO
        _log.log(
            level,
            "reading %s at image_size=%d; it stores %d",
            files.source,
            size,
            stored.image_size,
        )
    spec = ImageSpec(
        image_size=size,
        training=config.training,
        encoding=stored.encoding,
        stored_size=stored.image_size if stored.encoding == "raw" else None,
    )
    cache = _cache_client(files, config.shard_cache) if files.remote else None
    return ImageDataset(
        config=config,
        files=files,
        rank=rank,
        world_size=world,
        image_spec=spec,
        num_classes=len(manifest.label_names),
        cache=cache,
    )


def _cache_client(files: SplitFiles, config: Any) -> Any:
    """The host's shard cache client for a bucket split; this process owns the cache (and
    downloads for the host) unless another process already does."""
    from tfrecord_io.cache import CacheConfig, RemoteShard, default_cache_bytes, default_cache_dir
    from tfrecord_io.cache.client import open_shared_cache

    if config is None:
        config = CacheConfig(
            cache_dir=default_cache_dir(files.source), cache_bytes=default_cache_bytes()
        )
    shards = [
        RemoteShard(files.path(i), files.sizes[i], files.sha256[i]) for i in range(len(files.files))
    ]
    owned, client = open_shared_cache(config, shards)
    if owned is not None:
        _OWNED_CACHES[os.path.abspath(config.cache_dir)] = owned
    return client
