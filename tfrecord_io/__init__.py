"""tfrecord_io: the fast, resumable tf.data reader for image TFRecord shards, and verification."""

try:
    import tensorflow  # noqa: F401  (the reader is tf.data through and through)
except ImportError as e:  # a pipeline-only install: the package leaves TensorFlow to an extra
    raise ImportError(
        "tfrecord_io needs TensorFlow, which the package installs only with its 'tensorflow' "
        "extra: pip install 'tfrecord-service[tensorflow]' (or pip install -r requirements.txt)"
    ) from e

from tfrecord_io.cache import (
    CacheConfig,
    CacheDirInUseError,
    RemoteShard,
    ShardCache,
    ShardIntegrityError,
    default_cache_dir,
    open_cache,
    open_default_cache,
)
from tfrecord_io.decode import MEAN_RGB, STDDEV_RGB, DecodeConfig
from tfrecord_io.reader import CorruptionCounter, ReaderConfig, make_dataset
from tfrecord_io.service_client import (
    BULK_READ_EXPERIMENTS,
    COMPRESSIONS,
    DistributeOptions,
    ServiceAddress,
    distribute_dataset,
    enable_bulk_reads,
    training_job_name,
)
from tfrecord_io.source import (
    ResolvedSource,
    ShardFile,
    label_names,
    load_manifest,
    num_classes,
    resolve_source,
)
from objstore import (
    ObjectAccessError,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    RetryPolicy,
    get_store,
    install_log_redaction,
    redact,
    register_secret,
)
from tfrecord_io.verification import ShardReport, VerifyReport, verify_dataset

__all__ = [
    "MEAN_RGB",
    "STDDEV_RGB",
    "DecodeConfig",
    "CorruptionCounter",
    "ReaderConfig",
    "make_dataset",
    "ResolvedSource",
    "ShardFile",
    "label_names",
    "load_manifest",
    "num_classes",
    "resolve_source",
    "ShardReport",
    "VerifyReport",
    "verify_dataset",
    "BULK_READ_EXPERIMENTS",
    "COMPRESSIONS",
    "DistributeOptions",
    "ServiceAddress",
    "distribute_dataset",
    "enable_bulk_reads",
    "training_job_name",
    "CacheConfig",
    "CacheDirInUseError",
    "RemoteShard",
    "ShardCache",
    "ShardIntegrityError",
    "default_cache_dir",
    "open_cache",
    "open_default_cache",
    "ObjectAccessError",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreError",
    "RetryPolicy",
    "get_store",
    "install_log_redaction",
    "redact",
    "register_secret",
]
