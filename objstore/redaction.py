"""Secret redaction: credentials never reach a message or a log record.

Every message the object-store layer builds goes through ``redact``, and
``install_log_redaction`` makes every log record of the process pass through it too, so a
credential given on the command line or in the environment cannot leak through a library's own
log lines either.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

__all__ = ["install_log_redaction", "redact", "register_secret"]

# Environment variables whose values are credentials (or identify them) wherever they appear.
_SECRET_ENV_VARS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ACCESS_KEY_ID",
)
_MIN_SECRET_LEN = 6
_REDACTED = "***"
_registered_secrets: set[str] = set()
_secrets_lock = threading.Lock()

_REDACT_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # PEM private keys (service-account JSON).
    (
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
        _REDACTED,
    ),
    # Command-line flags: --s3_secret_access_key VALUE / --s3_secret_access_key=VALUE.
    (
        re.compile(
            r"(?i)(--s3_(?:secret_access_key|session_token|access_key_id))(\s*=\s*|\s+)(\S+)"
        ),
        r"\1\2" + _REDACTED,
    ),
    # key=value, key: value and JSON "key": "value" forms of credential fields.
    (
        re.compile(
            r"(?i)((?:aws_)?(?:secret_access_key|access_key_id|session_token|security_token)"
            r"|private_key(?:_id)?|client_secret|refresh_token|access_token|password)"
            r"(['\"]?\s*[:=]\s*['\"]?)([^\s'\",&}]+)"
        ),
        r"\1\2" + _REDACTED,
    ),
    # Pre-signed URL parameters and signature headers.
    (
        re.compile(r"(?i)(X-Amz-(?:Signature|Credential|Security-Token)=)[^&\s'\"]+"),
        r"\1" + _REDACTED,
    ),
    (re.compile(r"(?i)(Credential=)[^,\s'\"]+"), r"\1" + _REDACTED),
    (re.compile(r"(?i)(Signature=)[0-9a-f]{16,}"), r"\1" + _REDACTED),
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)[^'\"\n]+"), r"\1" + _REDACTED),
    # user:password@ inside URIs.
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1" + _REDACTED + "@"),
)


def register_secret(value: str | None) -> None:
    """Adds a credential value (e.g. from a command-line flag) that ``redact`` must hide.

    Values shorter than 6 characters are ignored: hiding them would garble ordinary text.
    """
    if value and len(value) >= _MIN_SECRET_LEN:
        with _secrets_lock:
            _registered_secrets.add(value)


def _known_secrets() -> list[str]:
    values = [os.environ.get(name, "") for name in _SECRET_ENV_VARS]
    with _secrets_lock:
        values.extend(_registered_secrets)
    # Longest first, so that a secret containing another is replaced whole.
    return sorted({v for v in values if len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True)


def redact(text: object) -> str:
    """Returns ``str(text)`` with credentials replaced by ``***``.

    It hides the values of the AWS credential variables, every value given to
    ``register_secret``, and anything that looks like a credential field, a signature or a
    password inside a URI.
    """
    out = str(text)
    for secret in _known_secrets():
        out = out.replace(secret, _REDACTED)
    for pattern, replacement in _REDACT_PATTERNS:
        out = pattern.sub(replacement, out)
    return out


_factory_lock = threading.Lock()
_factory_installed = False


def install_log_redaction() -> None:
    """Makes every log record created in this process pass through ``redact``.

    A record factory is used rather than a handler filter because it also covers handlers and
    loggers created later (Beam, botocore and absl add their own). Idempotent.
    """
    global _factory_installed
    with _factory_lock:
        if _factory_installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            try:
                message = record.getMessage()
            except Exception:  # a malformed record is logging's problem, not ours
                return record
            record.msg, record.args = redact(message), None
            if record.exc_info and record.exc_info[1] is not None:
                record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
                record.exc_info = None
            return record

        logging.setLogRecordFactory(factory)
        _factory_installed = True
