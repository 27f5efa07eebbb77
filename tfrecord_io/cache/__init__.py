"""A bounded local cache that streams shard files from object stores into ``tf.data``.

TensorFlow 2.21 cannot open ``s3://`` and its ``gs://`` ignores ``STORAGE_EMULATOR_HOST``, so
shards are downloaded to local disk and ``tf.data`` reads the local copies. The cache:

* downloads ahead in read order, a bounded number of shards ahead, on background threads;
* checks every download's size and SHA-256 against ``dataset.json``; a mismatch fails with an
  error naming the shard, and the bad bytes are removed;
* keeps the files it holds within ``cache_bytes``, evicting shards that were already read, least
  recently used first;
* refuses to start when ``cache_bytes`` is smaller than the largest shard.

**How tf.data waits for a shard without ``py_function``.** ``py_function`` cannot be
checkpointed, and a generator of local paths cannot either. Instead the two sides talk through
small marker files, using only TensorFlow graph ops:

1. ``read_ahead`` maps the (shuffled) file stream with ``tf.io.write_file`` of a request marker
   ``requests/<name>.ahead.0`` and prefetches ``download_ahead`` elements: markers are written in
   read order, ahead of the interleave that reads them.
2. ``records`` (used inside the interleave function in place of ``TFRecordDataset``) has two
   waits. When the interleave builds the element (and when a checkpoint is restored), if the
   shard is not on disk yet, it writes ``requests/<name>.want.<id>`` (a random request id)
   and polls (``tf.io.matching_files`` in a ``take_while`` over a sleeping ``range``) until
   ``shards/<name>`` or ``errors/<name>`` exists, then writes ``requests/<name>.done.<id>``.
   On the element's first read, in tf.data's own thread, it writes ``.need.<id>`` (another
   id) and polls until ``acks/<name>.<id>`` or the error exists; ``TFRecordDataset`` opens the
   file in that same step, and after the last record that id's ``.done`` is written. An error
   marker fails the step with its text, which names the URI.
3. A scanner thread here, woken by inotify, turns markers into download jobs (wanted shards
   first) and *pins* a shard for each want or need until its done: a pinned shard is not
   evicted. A need is acked only once the verified file is in place and pinned. Pins also end
   when the process is seen holding the file open (evicting an open file is harmless on POSIX:
   the reader keeps its descriptor) or after ``pin_s`` (an abandoned iterator). A want's pin
   lasts only until its waiter has seen the file, so elements that ``interleave`` builds
   ahead hold no space: a cache of one shard still makes progress.

**What resumes exactly.** The iterator state that ``tf.train.Checkpoint(iterator=it)`` saves is
plain tf.data state: file order, prefetch buffer, interleave positions and record offsets.
Restoring re-runs the interleave function for the shards in flight, whose first wait
re-downloads them, so a fresh process with an empty cache continues exactly. The
restored record readers reopen the *same local path*, so a restore must use the same
``cache_dir`` (the default is derived from the source URI). The marker ops are
stateful, so the file stream carries ``ExternalStatePolicy.IGNORE``: they hold no state that
would need saving.

One process owns a cache directory at a time (an ``flock`` on ``cache_dir/.lock``).

**Other processes on the host** (PyTorch ``DataLoader`` workers, other training ranks) read
through the owner with a ``CacheClient``, which writes the same ``need``/``done`` markers in
Python, without TensorFlow: ``open_shared_cache(config, shards)`` makes the first process the
owner and gives every process a client, so the host downloads each shard once. The owner
answers only for shards registered with it, so every process passes the whole split's shards.
A client ends its pin right after opening the file; the owner cannot see another process's
open files, so a shard a client still reads may be evicted (harmless on POSIX, but the disk
keeps those bytes until the client closes the file, beyond ``cache_bytes``).

The code is split by mechanism: ``handoff`` (the graph side above, what ``tf.data`` sees),
``state`` (the Python state machine: requests, pins, eviction, downloads), ``client`` (the
protocol's reader side for any process, in Python), ``names`` (the local file name of a URI,
in pure Python, the same as the graph side's), ``watch`` (the inotify watch that wakes the
scanner and the clients) and ``config`` (configuration, errors, default directory). The Python
side imports and runs without TensorFlow; only the graph side needs it.
"""

from tfrecord_io.cache.client import CacheClient, open_shared_cache
from tfrecord_io.cache.config import (
    DEFAULT_CACHE_BYTES,
    CacheConfig,
    CacheDirInUseError,
    CacheStats,
    RemoteShard,
    ShardIntegrityError,
    default_cache_bytes,
    default_cache_dir,
)
from tfrecord_io.cache.names import local_name, local_names
from tfrecord_io.cache.state import ShardCache, open_cache, open_default_cache

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "CacheClient",
    "CacheConfig",
    "CacheDirInUseError",
    "CacheStats",
    "RemoteShard",
    "ShardCache",
    "ShardIntegrityError",
    "default_cache_bytes",
    "default_cache_dir",
    "local_name",
    "local_names",
    "open_cache",
    "open_default_cache",
    "open_shared_cache",
]
