"""Local paths (and ``file://``) behind the same operations as the object stores.

``storage_for(path)`` gives the one store for any path the project reads: ``s3://`` and ``gs://``
get their ``ObjectStore`` (``objstore.stores``), a local path or ``file://`` URI a
``LocalStore``. So the pipeline, the reader and the tools open, list, stat and read ranges
without branching on the scheme. Every call runs through the same retry loop and policy
(``objstore.retry``); a local ``OSError`` is permanent, so it is raised at once, unchanged (a
missing file stays a ``FileNotFoundError`` naming the path).
"""

from __future__ import annotations

import builtins
import glob as globlib
import hashlib
import os
import shutil
from collections.abc import Callable
from typing import TypeVar

from objstore.atomic import temporary_path, write_atomic
from objstore.retry import RetryPolicy, retry_call
from objstore.settings import StoreSettings
from objstore.stores import ObjectInfo, ObjectStore, get_store
from objstore.uris import SCHEMES

__all__ = ["LocalStore", "Storage", "local_path", "storage_for"]

_T = TypeVar("_T")
_COPY_CHUNK = 8 << 20


def local_path(path: str) -> str:
    """The plain filesystem path of a local path or ``file://`` URI."""
    return path[len("file://") :] if path.startswith("file://") else path


class LocalStore:
    """The local filesystem, with ``ObjectStore``'s operations on paths and ``file://`` URIs."""

    scheme = "file"

    def __init__(self, retry: RetryPolicy | None = None) -> None:
        self.retry = retry or RetryPolicy()

    def call(self, action: str, path: str, fn: Callable[[], _T]) -> _T:
        """Runs ``fn`` with the retry policy; a permanent failure is raised as it came."""
        return retry_call(fn, policy=self.retry, action=action, uri=path)

    def size(self, path: str) -> int:
        """Size in bytes of a file.

        Raises:
          FileNotFoundError: if it does not exist.
        """
        return self.call("stat", path, lambda: os.path.getsize(local_path(path)))

    def exists(self, path: str) -> bool:
        """True if a file (or directory) is at ``path``."""
        return os.path.exists(local_path(path))

    def isdir(self, path: str) -> bool:
        """True if ``path`` is a directory."""
        return os.path.isdir(local_path(path))

    def read_bytes(self, path: str) -> bytes:
        """Reads a whole (small) file."""

        def read() -> bytes:
            with open(local_path(path), "rb") as f:
                return f.read()

        return self.call("read", path, read)

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Reads bytes ``[start, end)`` with one ``pread``.

        Raises:
          ValueError: if the range is empty or negative, or the file ends before ``end``.
        """
        if not 0 <= start < end:
            raise ValueError(f"byte range must satisfy 0 <= start < end, got [{start}, {end})")

        def read() -> bytes:
            with open(local_path(path), "rb") as f:
                return os.pread(f.fileno(), end - start, start)

        data = self.call(f"read bytes [{start}, {end})", path, read)
        if len(data) != end - start:
            raise ValueError(
                f"{path}: bytes [{start}, {end}) asked, but the file ends at {start + len(data)}"
            )
        return data

    def write_bytes(self, path: str, data: bytes) -> None:
        """Writes a whole file under a temporary name, then renames it (parents are made)."""
        local = local_path(path)

        def write() -> None:
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            write_atomic(local, data)

        self.call("write", path, write)

    def upload(self, path: str, local_source: str) -> None:
        """Copies the local file ``local_source`` to ``path`` under a temporary name, then
        renames it (parents are made), so nobody sees a partial file under ``path``.

        Raises:
          FileNotFoundError: if ``local_source`` does not exist.
        """
        local = local_path(path)

        def copy() -> None:
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            temporary = temporary_path(local)
            try:
                shutil.copyfile(local_source, temporary)
                os.replace(temporary, local)
            except BaseException:
                if os.path.exists(temporary):
                    os.unlink(temporary)
                raise

        self.call("write", path, copy)

    def delete(self, path: str) -> None:
        """Deletes one file; a missing file is not an error."""
        try:
            os.unlink(local_path(path))
        except FileNotFoundError:
            pass

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        """Every file whose path starts with ``prefix`` (under its directory, at any depth),
        sorted by path."""
        local = local_path(prefix)
        top = local if local.endswith(os.sep) else os.path.dirname(local) or "."

        def listing() -> builtins.list[ObjectInfo]:
            found = []
            for directory, _, names in os.walk(top):
                for name in names:
                    path = os.path.join(directory, name)
                    if path.startswith(local):
                        found.append(ObjectInfo(path, os.path.getsize(path)))
            return sorted(found, key=lambda info: info.uri)

        return self.call("list", prefix, listing)

    def list_one_level(self, path: str) -> tuple[builtins.list[str], builtins.list[ObjectInfo]]:
        """What is directly in the directory ``path``: its subdirectories and its files.

        Symbolic links to directories are left out (as a recursive listing leaves them); links
        to files are listed with the size and modification time of their target.

        Returns:
          ``(subdirectories, files)``: paths (``file://`` kept if given) without a trailing
          separator, sorted; and the files with their sizes and modification times, sorted.

        Raises:
          FileNotFoundError / NotADirectoryError: if ``path`` is not a directory.
        """
        root = path.rstrip("/") or "/"

        def join(name: str) -> str:
            return f"{root}/{name}" if root.startswith("file://") else os.path.join(root, name)

        def scan() -> tuple[builtins.list[str], builtins.list[ObjectInfo]]:
            dirs, files = [], []
            with os.scandir(local_path(root)) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        dirs.append(join(entry.name))
                    elif entry.is_file():
                        info = entry.stat()
                        files.append(ObjectInfo(join(entry.name), info.st_size, info.st_mtime))
            return sorted(dirs), sorted(files, key=lambda info: info.uri)

        return self.call("list one level", path, scan)

    def digest(self, path: str, *, chunk_bytes: int = _COPY_CHUNK) -> tuple[int, str]:
        """``(size, SHA-256 hex)`` of a file, streamed.

        Raises:
          FileNotFoundError: if it does not exist.
        """

        def read() -> tuple[int, str]:
            digest = hashlib.sha256()
            size = 0
            with open(local_path(path), "rb") as f:
                while chunk := f.read(chunk_bytes):
                    digest.update(chunk)
                    size += len(chunk)
            return size, digest.hexdigest()

        return self.call("read", path, read)

    def glob(self, pattern: str) -> builtins.list[str]:
        """Files (not directories) matching a glob, sorted."""
        matched = globlib.glob(local_path(pattern))
        return sorted(p for p in matched if os.path.isfile(p))

    def download(
        self,
        path: str,
        dest: str,
        *,
        expected_size: int | None = None,
        chunk_bytes: int = _COPY_CHUNK,
    ) -> str:
        """Copies a file to ``dest`` and returns its SHA-256 (hex).

        Raises:
          OSError: from the filesystem; ValueError if it is not ``expected_size`` bytes.
        """

        def copy() -> str:
            digest = hashlib.sha256()
            with open(local_path(path), "rb") as src, open(dest, "wb") as out:
                while chunk := src.read(chunk_bytes):
                    digest.update(chunk)
                    out.write(chunk)
            return digest.hexdigest()

        digest = self.call("read", path, copy)
        if expected_size is not None and os.path.getsize(dest) != expected_size:
            raise ValueError(f"{path}: file is {os.path.getsize(dest)} bytes, not {expected_size}")
        return digest


Storage = ObjectStore | LocalStore

_LOCAL = LocalStore()


def storage_for(
    path: str, retry: RetryPolicy | None = None, settings: StoreSettings | None = None
) -> Storage:
    """The store that serves ``path``: ``s3://`` and ``gs://`` their ``ObjectStore`` (configured
    from the environment and ``settings``), a local path or ``file://`` URI the ``LocalStore``.

    Raises:
      ValueError: for any other scheme, naming the ones supported.
    """
    scheme, sep, _ = path.partition("://")
    if sep and scheme in SCHEMES:
        return get_store(path, retry, settings)
    if sep and scheme != "file":
        raise ValueError(
            f"unsupported storage scheme {scheme!r} in {path!r}: expected a local path, file://, "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    return _LOCAL if retry is None else LocalStore(retry)
