"""Object-store corners of Beam FileSystems that the pipeline has to work around.

* Beam's S3 filesystem writes every file as a multipart upload and completes it with no parts
  when the file is empty; S3 (and moto) reject that with ``MalformedXML``. Empty shards and
  empty reports are legitimate, so ``create_empty_file`` writes them with one ``PutObject``,
  through Beam's own S3 client and the options Beam's FileSystems were given (``--s3_*`` flags,
  or else the standard ``AWS_*`` environment, which boto3 reads itself).
* Beam hands its options to FileSystems only when a ``Pipeline`` is built, so a launcher that
  lists or checks ``s3://`` paths before that must call ``FileSystems.set_options`` first.
* Beam's S3 reads retry a failed request but not a body cut short in transit, so
  ``read_with_retries`` runs each whole read through ``objstore``'s retry loop and policy (the
  same as the reader's) before a file is called unreadable.
"""

from __future__ import annotations

from collections.abc import Callable

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from objstore import RetryPolicy, retry_call

__all__ = ["create_empty_file", "read_with_retries"]


def read_with_retries(
    uri: str, read: Callable[[], bytes], policy: RetryPolicy | None = None
) -> bytes:
    """Runs ``read`` (one whole read of ``uri``), retrying transient storage failures.

    Uses ``objstore.retry_call``: a transient failure is retried with jittered exponential backoff
    up to ``policy.max_attempts`` attempts (``RetryPolicy()`` by default); a permanent failure
    (missing object, 403, a local ``OSError``) is raised at once.

    Raises:
      Exception: the last failure, after the last transient one or at the first permanent.
    """
    return retry_call(read, policy=policy or RetryPolicy(), action="read", uri=uri)


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
