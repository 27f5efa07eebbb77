"""tfrecord_io: the fast, resumable tf.data reader for image TFRecord shards, and verification."""

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING, Any


def _tensorflow_missing() -> bool:
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"] is None
    return importlib.util.find_spec("tensorflow") is None


# The reader is tf.data through and through, but TensorFlow is imported only when a name that
# needs it is first used: the catalog tools (``python -m tfrecord_io.diff``) run without paying
# for it. Its absence is still reported here, at import.
if _tensorflow_missing():  # a pipeline-only install: the package leaves TensorFlow to an extra
    raise ImportError(
        "tfrecord_io needs TensorFlow, which the package installs only with its 'tensorflow' "
        "extra: pip install 'tfrecord-service[tensorflow]' (or pip install -r requirements.txt)"
    )

if TYPE_CHECKING:
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
    from tfrecord_io.delivery import (
        AddResult,
        DeliveredSet,
        DeliveryTracker,
        decode_positions,
        split_digest,
    )
    from tfrecord_io.random_access import ExampleLocation, KeyedExample, read_examples
    from tfrecord_io.read_config import ReadConfig
    from tfrecord_io.reader import CorruptionCounter, ReaderConfig, make_dataset
    from tfrecord_io.service_client import (
        BULK_READ_EXPERIMENTS,
        COMPRESSIONS,
        DistributeOptions,
        ServiceAddress,
        ServiceConfig,
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
    from tfrecord_io.verification import ShardReport, VerifyReport, verify_dataset


_MODULE_OF = {
    "CacheConfig": "tfrecord_io.cache",
    "CacheDirInUseError": "tfrecord_io.cache",
    "RemoteShard": "tfrecord_io.cache",
    "ShardCache": "tfrecord_io.cache",
    "ShardIntegrityError": "tfrecord_io.cache",
    "default_cache_dir": "tfrecord_io.cache",
    "open_cache": "tfrecord_io.cache",
    "open_default_cache": "tfrecord_io.cache",
    "MEAN_RGB": "tfrecord_io.decode",
    "STDDEV_RGB": "tfrecord_io.decode",
    "DecodeConfig": "tfrecord_io.decode",
    "CorruptionCounter": "tfrecord_io.reader",
    "ReadConfig": "tfrecord_io.read_config",
    "ReaderConfig": "tfrecord_io.reader",
    "make_dataset": "tfrecord_io.reader",
    "AddResult": "tfrecord_io.delivery",
    "DeliveredSet": "tfrecord_io.delivery",
    "DeliveryTracker": "tfrecord_io.delivery",
    "decode_positions": "tfrecord_io.delivery",
    "split_digest": "tfrecord_io.delivery",
    "BULK_READ_EXPERIMENTS": "tfrecord_io.service_client",
    "COMPRESSIONS": "tfrecord_io.service_client",
    "DistributeOptions": "tfrecord_io.service_client",
    "ServiceAddress": "tfrecord_io.service_client",
    "ServiceConfig": "tfrecord_io.service_client",
    "distribute_dataset": "tfrecord_io.service_client",
    "enable_bulk_reads": "tfrecord_io.service_client",
    "training_job_name": "tfrecord_io.service_client",
    "ResolvedSource": "tfrecord_io.source",
    "ShardFile": "tfrecord_io.source",
    "label_names": "tfrecord_io.source",
    "load_manifest": "tfrecord_io.source",
    "num_classes": "tfrecord_io.source",
    "resolve_source": "tfrecord_io.source",
    "ObjectAccessError": "objstore",
    "ObjectNotFoundError": "objstore",
    "ObjectStore": "objstore",
    "ObjectStoreError": "objstore",
    "RetryPolicy": "objstore",
    "get_store": "objstore",
    "install_log_redaction": "objstore",
    "redact": "objstore",
    "register_secret": "objstore",
    "ExampleLocation": "tfrecord_io.random_access",
    "KeyedExample": "tfrecord_io.random_access",
    "read_examples": "tfrecord_io.random_access",
    "ShardReport": "tfrecord_io.verification",
    "VerifyReport": "tfrecord_io.verification",
    "verify_dataset": "tfrecord_io.verification",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'tfrecord_io' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "MEAN_RGB",
    "STDDEV_RGB",
    "DecodeConfig",
    "CorruptionCounter",
    "ReadConfig",
    "ReaderConfig",
    "make_dataset",
    "AddResult",
    "DeliveredSet",
    "DeliveryTracker",
    "decode_positions",
    "split_digest",
    "ResolvedSource",
    "ShardFile",
    "label_names",
    "load_manifest",
    "num_classes",
    "resolve_source",
    "ExampleLocation",
    "KeyedExample",
    "read_examples",
    "ShardReport",
    "VerifyReport",
    "verify_dataset",
    "BULK_READ_EXPERIMENTS",
    "COMPRESSIONS",
    "DistributeOptions",
    "ServiceAddress",
    "ServiceConfig",
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
