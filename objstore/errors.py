"""Error classification: which failures of the storage clients are worth another attempt.

Transient: HTTP 408/429/5xx, connection resets, timeouts, bodies cut short in transit.
Permanent: everything else (403, a missing bucket or object, a bad request, a local ``OSError``).
The classifier understands the exceptions of s3fs/botocore, google-cloud-storage,
requests/urllib3, aiohttp and Beam's S3 client, following ``__cause__`` / ``__context__``.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

from objstore.redaction import redact

__all__ = [
    "ObjectAccessError",
    "ObjectNotFoundError",
    "ObjectStoreError",
    "ShortReadError",
    "classify",
    "describe",
    "error_code",
]


class ObjectStoreError(OSError):
    """An object-store call failed. The message names the URI and never holds credentials.

    Attributes:
      uri: the object or prefix the call was about.
      transient: True if the last failure was transient (retries were exhausted).
      attempts: how many attempts were made.
    """

    def __init__(self, message: str, *, uri: str, transient: bool = False, attempts: int = 1):
        super().__init__(redact(message))
        self.uri = uri
        self.transient = transient
        self.attempts = attempts

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ObjectNotFoundError(ObjectStoreError, FileNotFoundError):
    """The bucket or the object does not exist."""


class ObjectAccessError(ObjectStoreError, PermissionError):
    """The credentials are missing, wrong, or not allowed to do this (HTTP 401/403)."""


_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class ShortReadError(Exception):
    """A read returned fewer bytes than asked for (a body cut short in transit): transient."""


def _exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    status_code = getattr(response, "status_code", None)  # requests / google-resumable-media
    if isinstance(status_code, int):
        return status_code
    # google.api_core's GoogleAPICallError and Beam's S3ClientError carry the status as .code.
    code = getattr(exc, "code", None)
    module = type(exc).__module__
    if isinstance(code, int) and 100 <= code < 600 and module.startswith(("google", "apache_beam")):
        return code
    return None


def error_code(exc: BaseException) -> str:
    for e in _exception_chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
    return ""


_TRANSIENT_MODULE_PREFIXES = (
    "aiohttp",
    "urllib3.exceptions",
    "requests.exceptions",
    "google.auth.exceptions",
    "google.resumable_media",
    "google.cloud.storage.exceptions",
)
_TRANSIENT_BOTOCORE_NAMES = frozenset(
    {
        "HTTPClientError",
        "ConnectionError",
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ProxyConnectionError",
        "ResponseParserError",
    }
)


def classify(exc: BaseException) -> tuple[int | None, bool]:
    """The HTTP status behind ``exc`` (if any) and whether retrying may help."""
    for e in _exception_chain(exc):
        status = _http_status(e)
        if status is not None:
            return status, status in _TRANSIENT_STATUS
    for e in _exception_chain(exc):
        if isinstance(e, (PermissionError, FileNotFoundError)):
            return None, False
        if isinstance(
            e,
            (
                ConnectionError,
                TimeoutError,
                socket.timeout,
                http.client.IncompleteRead,
                http.client.RemoteDisconnected,
                ShortReadError,
            ),
        ):
            return None, True
        module = type(e).__module__
        if module.startswith("botocore") and type(e).__name__ in _TRANSIENT_BOTOCORE_NAMES:
            return None, True
        if module.startswith(_TRANSIENT_MODULE_PREFIXES):
            # Their HTTP errors carried a status above; what is left is transport trouble or
            # a failed download checksum, both worth another attempt.
            return None, True
        if module.startswith("fsspec") and "Timeout" in type(e).__name__:
            return None, True
    return None, False


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if len(text) > 300:
        text = text[:300] + "…"
    return redact(f"{type(exc).__name__}: {text}")
