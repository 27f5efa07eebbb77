"""tfrecord_io: the fast, resumable tf.data reader for image TFRecord shards.

Subpackages: ``tfrecord_io.cache`` (the local shard cache for object-store datasets) and
``tfrecord_io.service`` (the tf.data service: dispatcher and worker processes, and the client).
The dataset tools (verify, inspect, diff, adopt) are the ``dataset_tools`` package.

Names are loaded on first use, so that what needs no TensorFlow (``tfrecord_io.source``,
``tfrecord_io.cache``, ``tfrecord_io.delivery``) imports without it: ``dataset_tools.diff`` runs on
a pipeline-only install. A name whose module needs TensorFlow raises ``ImportError`` naming the
extra to install. Importing the package keeps TensorFlow's start-up lines quiet
(``cliflags.quiet_tensorflow``) unless ``TF_CPP_MIN_LOG_LEVEL`` is set.
"""

from cliflags import lazy_names, quiet_tensorflow

# TensorFlow's C++ start-up lines and info logs stay out of a user's output unless they set
# TF_CPP_MIN_LOG_LEVEL themselves (or imported TensorFlow first).
quiet_tensorflow()

# Public name -> the module that defines it: the one list of this package's API.
_MODULE_OF = {
    # tfrecord_io.reader
    "make_dataset": "tfrecord_io.reader",
    # tfrecord_io.read_config
    "ReadConfig": "tfrecord_io.read_config",
    "ReaderConfig": "tfrecord_io.read_config",
    # tfrecord_io.shard_reading
    "CorruptionCounter": "tfrecord_io.shard_reading",
    # tfrecord_io.decode
    "MEAN_RGB": "tfrecord_io.decode",
    "STDDEV_RGB": "tfrecord_io.decode",
    "DecodeConfig": "tfrecord_io.decode",
    # tfrecord_io.source
    "ResolvedSource": "tfrecord_io.source",
    "ShardFile": "tfrecord_io.source",
    "ShardFiles": "tfrecord_io.source",
    "label_names": "tfrecord_io.source",
    "load_manifest": "tfrecord_io.source",
    "num_classes": "tfrecord_io.source",
    "resolve_source": "tfrecord_io.source",
    # tfrecord_io.delivery
    "AddResult": "tfrecord_io.delivery",
    "DeliveredSet": "tfrecord_io.delivery",
    "DeliveryTracker": "tfrecord_io.delivery",
    "decode_positions": "tfrecord_io.delivery",
    "split_digest": "tfrecord_io.delivery",
    # tfrecord_io.random_access
    "ExampleLocation": "tfrecord_io.random_access",
    "KeyedExample": "tfrecord_io.random_access",
    "read_examples": "tfrecord_io.random_access",
    # tfrecord_io.cache
    "CacheConfig": "tfrecord_io.cache",
    "CacheDirInUseError": "tfrecord_io.cache",
    "RemoteShard": "tfrecord_io.cache",
    "ShardCache": "tfrecord_io.cache",
    "ShardIntegrityError": "tfrecord_io.cache",
    "default_cache_dir": "tfrecord_io.cache",
    "open_cache": "tfrecord_io.cache",
    "open_default_cache": "tfrecord_io.cache",
    # tfrecord_io.service.client
    "BULK_READ_EXPERIMENTS": "tfrecord_io.service.client",
    "COMPRESSIONS": "tfrecord_io.service.client",
    "DistributeOptions": "tfrecord_io.service.client",
    "ServiceAddress": "tfrecord_io.service.client",
    "ServiceConfig": "tfrecord_io.service.client",
    "distribute_dataset": "tfrecord_io.service.client",
    "enable_bulk_reads": "tfrecord_io.service.client",
    "training_job_name": "tfrecord_io.service.client",
}
__all__ = sorted(_MODULE_OF)

_TENSORFLOW_HINT = (
    "TensorFlow, which the package installs only with its 'tensorflow' extra: pip install "
    "'tfrecord-service[tensorflow]' (or pip install -r requirements.txt)"
)
__getattr__, __dir__ = lazy_names(
    __name__, globals(), _MODULE_OF, install_hints={"tensorflow": _TENSORFLOW_HINT}
)
