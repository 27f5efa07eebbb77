"""``--audit_keys``: the key of every example trained on, in order, one per line.

It is the lineage of a model (which examples, in which order, went into it), and the way to
check that a resumed run trains on exactly the examples an uninterrupted one would.

The file always agrees with the checkpoint: on resume it is cut back to the examples of the
steps the checkpoint holds, so steps trained after the last save and lost in a crash are not
listed twice. With several workers each keeps its own file, ``PATH.worker-<k>``, because each
trains on its own shard of every global batch.

A resume on another layout (``trainer.resume``: elastic) starts a new *segment* of files,
``PATH.from-<step>`` (and ``.worker-<k>``), and the chief cuts the previous segment's files
back to the checkpoint's step and empties those of runs that started at or after it and never
saved. The union of all the files is then exactly what the checkpoint's model trained on.
Lines reach the operating system after every step, so a process killed between checkpoints
still shows what it trained on (the next resume cuts those lines).
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["KeyAudit", "audit_path", "close_previous_segments"]

_log = logging.getLogger(__name__)


def audit_path(path: str, *, num_workers: int, worker_index: int, start_step: int = 0) -> str:
    """The audit file of a worker: ``path`` itself on one worker, ``path.worker-<k>`` on many;
    for a segment started at step ``s > 0``, ``path.from-<s>`` before that suffix."""
    base = path if start_step == 0 else f"{path}.from-{start_step:08d}"
    if num_workers == 1:
        return base
    return f"{base}.worker-{worker_index:05d}"


def _cut(path: str, keep_lines: int) -> None:
    """Truncates ``path`` after its first ``keep_lines`` lines (if it exists)."""
    if not os.path.exists(path):
        return
    offset = 0
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if i == keep_lines:
                break
            offset += len(line)
    if os.path.getsize(path) != offset:
        _log.info("audit file %s: dropping keys after the checkpoint (byte %d)", path, offset)
        os.truncate(path, offset)


def _segment_start(path: str, name: str) -> int | None:
    """The start step of the segment an audit file belongs to, or None if it is not one."""
    rest = name[len(path) :]
    match = re.fullmatch(r"(?:\.from-(\d{8}))?(?:\.worker-\d{5})?", rest)
    if match is None:
        return None
    return int(match.group(1) or 0)


def close_previous_segments(
    path: str, previous: Mapping[str, Any] | None, *, step: int, current: set[str]
) -> None:
    """Cuts the files of the segment that wrote the checkpoint at ``step`` back to it, and
    empties those of segments that started at or after ``step`` (they never saved).

    Args:
      path: the ``--audit_keys`` path.
      previous: that segment (``start``, ``num_workers``, ``worker_batch``), or None.
      step: the checkpoint's step.
      current: this segment's files, left alone (each worker cuts its own).
    """
    kept: dict[str, int] = {}
    if previous:
        start, workers = int(previous["start"]), int(previous["num_workers"])
        for k in range(workers):
            name = audit_path(path, num_workers=workers, worker_index=k, start_step=start)
            kept[name] = (step - start) * int(previous["worker_batch"])
    for name in glob.glob(glob.escape(path) + "*"):
        began = _segment_start(path, name)
        if name in current or began is None:
            continue
        if name in kept:
            _cut(name, kept[name])
        elif began >= step:
            _cut(name, 0)


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
        self._file = open(path, "ab")  # kept open for the whole run
        if self._file.tell() != offset:
            _log.info("audit file %s: dropping keys after the checkpoint (byte %d)", path, offset)
            self._file.truncate(offset)
            self._file.seek(offset)

    def write(self, keys: Iterable[bytes]) -> None:
        """Appends keys (bytes, as the reader yields them); they reach the OS at once."""
        self._file.write(b"".join(k + b"\n" for k in keys))
        self._file.flush()

    def flush(self) -> None:
        """Makes every written key durable; called before each checkpoint."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()
