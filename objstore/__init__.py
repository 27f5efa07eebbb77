"""objstore: the project's object-store layer, at the bottom floor beside ``schemas``.

It imports nothing else of the project and never TensorFlow, so the Beam pipeline (whose
workers install the package without TensorFlow) and the tf.data reader share one implementation:

* ``stores``: ``s3://`` and ``gs://`` clients behind one ``ObjectStore`` interface (one client
  per process, retry policy and settings);
* ``local``: local paths behind the same operations, and ``storage_for``, the one store for any
  path (local, ``file://``, ``s3://``, ``gs://``), so callers never branch on the scheme;
* ``settings``: ``StoreSettings``, endpoints and credentials given as values (the pipeline's
  ``--s3_*`` flags) rather than read from the environment;
* ``errors``: which failures are transient, and the errors that name the URI;
* ``retry``: the one ``RetryPolicy`` and the one retry loop, ``retry_call``;
* ``redaction``: credentials never reach a message or a log record;
* ``uris``: parsing and joining ``scheme://bucket/key``, and the glob characters;
* ``atomic``: the temporary-name-then-rename helper, so no reader sees a partial file.
"""

from objstore.atomic import temporary_path, write_atomic
from objstore.errors import (
    ObjectAccessError,
    ObjectNotFoundError,
    ObjectStoreError,
    ShortReadError,
    classify,
    describe,
)
from objstore.local import LocalStore, Storage, local_path, storage_for
from objstore.redaction import install_log_redaction, redact, register_secret
from objstore.retry import Failure, RetryPolicy, retry_call
from objstore.settings import StoreSettings
from objstore.stores import GCSStore, ObjectInfo, ObjectStore, S3Store, get_store
from objstore.uris import GLOB_CHARS, SCHEMES, has_glob, is_object_store_uri, join_uri, parse_uri

__all__ = [
    "GLOB_CHARS",
    "SCHEMES",
    "Failure",
    "GCSStore",
    "LocalStore",
    "ObjectAccessError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreError",
    "RetryPolicy",
    "S3Store",
    "Storage",
    "StoreSettings",
    "ShortReadError",
    "classify",
    "describe",
    "get_store",
    "has_glob",
    "install_log_redaction",
    "is_object_store_uri",
    "join_uri",
    "local_path",
    "parse_uri",
    "redact",
    "register_secret",
    "retry_call",
    "storage_for",
    "temporary_path",
    "write_atomic",
]
