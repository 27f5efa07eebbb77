"""Client settings given as values: what a store needs besides the standard environment.

A process that configures its stores from flags rather than from the environment (the
pipeline's ``--s3_*`` flags, its ``--project``) passes a ``StoreSettings`` to ``get_store`` /
``storage_for``. Every field left at None falls back to what the client libraries read
themselves (``AWS_*``, ``STORAGE_EMULATOR_HOST``, application-default credentials), so
``StoreSettings()`` is the environment alone.

The credential fields never reach a message or a log: they are left out of ``repr`` and
registered with ``redaction.register_secret`` when the settings are made, in every process
(unpickling makes them again, so a worker that receives settings inside a pickled function
registers them too).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from objstore.redaction import redact, register_secret

__all__ = ["StoreSettings", "parse_verify"]

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def parse_verify(value: bool | str | None) -> bool | str | None:
    """What ``--s3_verify`` says: None (the client's default), a bool, or a CA bundle's path.

    Raises:
      ValueError: for an empty string, naming the flag.
    """
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    if not text:
        raise ValueError(
            "--s3_verify is empty: expected true, false or the path of a CA bundle (PEM)"
        )
    return text


def _optional_text(value: object, flag: str) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{flag} must be a non-empty string, got {redact(repr(value))}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreSettings:
    """How to reach ``s3://`` and ``gs://`` when the environment is not the whole story.

    The S3 fields are those of Beam's ``S3Options`` (``--s3_endpoint_url`` and so on), which
    the same pipeline hands to Beam's own S3 filesystem.

    Attributes:
      s3_endpoint_url: the S3 API's URL (``http(s)://host[:port]``); None: ``AWS_ENDPOINT_URL``
        or AWS itself.
      s3_access_key_id, s3_secret_access_key, s3_session_token: credentials; None: the AWS
        credential chain (``AWS_*`` variables, shared files, instance roles).
      s3_region_name: the region; None: ``AWS_REGION`` / ``AWS_DEFAULT_REGION``.
      s3_verify: None (verify with the default CAs), False (do not verify) or a CA bundle path.
      s3_use_ssl: False for plain HTTP (``--s3_disable_ssl``).
      s3_api_version: the S3 API version to ask for; None: the client's.
      gcs_emulator_host: a GCS API endpoint such as an emulator's (``http://host:port``), used
        with anonymous credentials as ``STORAGE_EMULATOR_HOST`` is; None: that variable or
        Google itself.
      gcs_project: the project for bucket-level calls; None: ``GOOGLE_CLOUD_PROJECT``.
    """

    s3_endpoint_url: str | None = None
    s3_access_key_id: str | None = dataclasses.field(default=None, repr=False)
    s3_secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    s3_session_token: str | None = dataclasses.field(default=None, repr=False)
    s3_region_name: str | None = None
    s3_verify: bool | str | None = None
    s3_use_ssl: bool = True
    s3_api_version: str | None = None
    gcs_emulator_host: str | None = None
    gcs_project: str | None = None

    def __post_init__(self) -> None:
        for name in ("s3_access_key_id", "s3_secret_access_key", "s3_session_token"):
            register_secret(getattr(self, name))  # first: the checks below may quote them
        for name in (
            "s3_access_key_id",
            "s3_secret_access_key",
            "s3_session_token",
            "s3_region_name",
            "s3_api_version",
            "gcs_project",
        ):
            _optional_text(getattr(self, name), f"--{name}")
        if (self.s3_access_key_id is None) != (self.s3_secret_access_key is None):
            raise ValueError(
                "--s3_access_key_id and --s3_secret_access_key go together: got only "
                + ("--s3_access_key_id" if self.s3_access_key_id else "--s3_secret_access_key")
            )
        for flag, url in (
            ("--s3_endpoint_url", self.s3_endpoint_url),
            ("STORAGE_EMULATOR_HOST (gcs_emulator_host)", self.gcs_emulator_host),
        ):
            if url is not None and not (
                isinstance(url, str) and url.startswith(("http://", "https://"))
            ):
                raise ValueError(
                    f"{flag} must be an http:// or https:// URL, got {redact(repr(url))}"
                )
        if not isinstance(self.s3_use_ssl, bool):
            raise ValueError(f"s3_use_ssl must be a bool, got {self.s3_use_ssl!r}")
        object.__setattr__(self, "s3_verify", parse_verify(self.s3_verify))

    def __reduce__(self) -> tuple[Any, ...]:
        # Made again through __init__ on unpickling, so the receiving process registers the
        # credentials with its redaction too.
        return (_from_fields, (dataclasses.asdict(self),))

    @property
    def s3_credentials_given(self) -> bool:
        """True if the settings carry an access key (rather than leave it to the AWS chain)."""
        return self.s3_access_key_id is not None


def _from_fields(fields: dict[str, Any]) -> StoreSettings:
    return StoreSettings(**fields)
