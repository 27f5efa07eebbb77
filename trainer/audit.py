"""``--audit_keys``: the key of every example trained on, in order, one per line.

It is the lineage of a model (which examples, in which order, went into it), and the way to
check that a resumed run trains on exactly the examples an uninterrupted one would.

The file always agrees with the checkpoint: on resume it is cut back to the examples of the
steps the checkpoint holds, so steps trained after the last save and lost in a crash are not
listed twice. With several workers each keeps its own file, ``PATH.worker-<k>``, because each
trains on its own shard of every global batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

__all__ = ["KeyAudit", "audit_path"]

_log = logging.getLogger(__name__)


def audit_path(path: str, *, num_workers: int, worker_index: int) -> str:
    """The audit file of a worker: ``path`` itself on one worker, ``path.worker-<k>`` on many."""
    if num_workers == 1:
        return path
    return f"{path}.worker-{worker_index:05d}"


class KeyAudit:
    """Appends example keys to a local file, one per line.

    Args:
      path: the file (created with its directory).
      keep_lines: lines the checkpoint accounts for; later lines are removed first.

    Raises:
      ValueError: if the file holds fewer lines than ``keep_lines`` (it does not belong to
        this run, or lines were lost), naming the file and both counts.
    """

    def __init__(self, path: str, *, keep_lines: int) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        existing = 0
        offset = 0
        if os.path.exists(path):
            with open(path, "rb") as f:
                for line in f:
                    if existing == keep_lines:
                        break
                    existing += 1
                    offset += len(line)
        if existing < keep_lines:
            raise ValueError(
                f"audit file {path} lists {existing} keys but the checkpoint has trained on "
                f"{keep_lines}; use the audit file written by this run, or a new path"
            )
        self._file = open(path, "ab")  # noqa: SIM115 - kept open for the whole run
        if self._file.tell() != offset:
            _log.info("audit file %s: dropping keys after the checkpoint (byte %d)", path, offset)
            self._file.truncate(offset)
            self._file.seek(offset)

    def write(self, keys: Iterable[bytes]) -> None:
        """Appends keys (bytes, as the reader yields them)."""
        self._file.write(b"".join(k + b"\n" for k in keys))

    def flush(self) -> None:
        """Makes every written key durable; called before each checkpoint."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()
