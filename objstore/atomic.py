"""Writing under a temporary name, then renaming: a reader never sees a partial file.

``temporary_path`` is the one naming of temporaries for the whole project (a hidden sibling,
``.<name>.tmp-<random>``, so listings that skip hidden files never pick one up, and a crash
leaves something recognisable to clean). It works for local paths and for URIs. ``write_atomic``
is the helper for whole local files; the pipeline's Beam FileSystems counterpart
(``beam_pipelines.engines.filesystems.write_file``) names its temporaries with ``temporary_path``
too.
"""

from __future__ import annotations

import os
import uuid

__all__ = ["temporary_path", "write_atomic"]


def temporary_path(path: str, directory: str | None = None) -> str:
    """A fresh hidden temporary name for ``path``: ``<dir>/.<name>.tmp-<hex>``.

    Args:
      path: the final path or URI.
      directory: where the temporary goes instead of beside ``path`` (same filesystem, so the
        rename stays atomic).
    """
    parent, _, name = path.rstrip("/").rpartition("/")
    if directory is not None:
        parent = directory.rstrip("/")
    return (
        f"{parent}/.{name}.tmp-{uuid.uuid4().hex}" if parent else f".{name}.tmp-{uuid.uuid4().hex}"
    )


def write_atomic(path: str, data: bytes, *, tmp_dir: str | None = None) -> None:
    """Writes a whole local file under a temporary name, then renames it over ``path``.

    Args:
      path: the local file to write (replaced if it exists).
      data: its bytes.
      tmp_dir: where the temporary goes (same filesystem as ``path``); beside ``path`` by
        default.

    Raises:
      OSError: from the filesystem; the temporary is removed.
    """
    temporary = temporary_path(path, tmp_dir)
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
