"""Object-store corners of Beam FileSystems that the pipeline has to work around.

* Beam's S3 filesystem writes every file as a multipart upload and completes it with no parts
  when the file is empty; S3 (and moto) reject that with ``MalformedXML``. Empty shards and
  empty reports are legitimate, so ``create_empty_file`` writes them with one ``PutObject``,
  through Beam's own S3 client and the options Beam's FileSystems were given (``--s3_*`` flags,
  or else the standard ``AWS_*`` environment, which boto3 reads itself).
* Beam hands its options to FileSystems only when a ``Pipeline`` is built, so a launcher that
  lists or checks ``s3://`` paths before that must call ``FileSystems.set_options`` first.
* Beam's S3 reads retry a failed request but not a body cut short in transit, so
  ``read_with_retries`` retries transient failures (a bounded number of times, with exponential
  backoff and jitter) before a file is called unreadable.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

__all__ = ["READ_ATTEMPTS", "create_empty_file", "read_with_retries"]

READ_ATTEMPTS = 5
_INITIAL_BACKOFF_S = 0.2
_MAX_BACKOFF_S = 5.0
_log = logging.getLogger(__name__)


def read_with_retries(uri: str, read: Callable[[], bytes], attempts: int = READ_ATTEMPTS) -> bytes:
    """Runs ``read`` (one whole read of ``uri``), retrying transient storage failures.

    Attempt ``n`` that fails transiently is followed by a sleep drawn from
    ``[0, min(5 s, 0.2 s * 2 ** (n - 1))]``; a permanent failure (missing object, 403, a local
    ``OSError``) is raised at once.

    Raises:
      Exception: the last failure, after ``attempts`` transient ones or at the first permanent.
    """
    for attempt in range(1, attempts + 1):
        try:
            return read()
        except Exception as e:
            # Imported only on failure: tfrecord_io's package pulls in TensorFlow.
            from tfrecord_io.storage import is_transient, redact

            if attempt == attempts or not is_transient(e):
                raise
            delay = random.uniform(
                0.0, min(_MAX_BACKOFF_S, _INITIAL_BACKOFF_S * 2 ** (attempt - 1))
            )
            _log.warning(
                "%s: read failed (%s); retry %d of %d in %.2fs",
                uri,
                redact(f"{type(e).__name__}: {e}")[:300],
                attempt,
                attempts - 1,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def create_empty_file(path: str) -> None:
    """Creates (or truncates) an empty file at any Beam FileSystems path.

    Raises:
      OSError / botocore errors: from the filesystem, naming the path.
    """
    if FileSystems.get_scheme(path) != "s3":
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED):
            pass
        return
    from apache_beam.io.aws import s3io

    # The options FileSystems was configured with (set by Beam on every worker); without them
    # boto3 falls back to the AWS environment, as Beam's own client does.
    options = getattr(FileSystems, "_pipeline_options", None) or PipelineOptions([])
    bucket, key = s3io.parse_s3_path(path)
    s3io.S3IO(options=options).client.client.put_object(Bucket=bucket, Key=key, Body=b"")
