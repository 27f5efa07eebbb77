"""A memory and a time budget per image that hold whatever a decoder does: a decode worker.

Pillow checks an image's size in its header, and some plugins again inside ``load()``, where
they first learn the real size; but a plugin (or the C library under it) may allocate before
any check, and nothing in a process can stop a C decoder that loops. So ``BoundedPreparer``
runs ``prepare_image`` in a persistent child process of its own:

* the child's whole address space is capped (``RLIMIT_AS``) at ``--decode_memory_mb``: an
  allocation past it fails inside the child (``MemoryError``, or the child dies), never in the
  Beam worker;
* the parent waits for each answer at most ``--decode_time_s`` of wall time, then kills the
  child and starts another for the next image;
* Pillow's own decompression-bomb checks run in the child with the limit from
  ``--max_pixels``, set there and nowhere else: the parent's ``PIL.Image.MAX_IMAGE_PIXELS``,
  and so the rest of a user's program, is left as it was.

Such inputs are rejected as ``over_budget`` (memory or time) or ``decoder_crashed`` (the child
died of a signal it was not sent). The child is started once and serves image after image, so
an image costs a copy of its bytes each way, not a process.

JPEG, PNG and WebP, the bulk of every dataset, are prepared in this process instead (while
``--max_pixels`` keeps one within the memory budget and Pillow's default limit): their decoders
learn the real size from the header, before any pixel memory is allocated, so the header check
(``--max_pixels``) and Pillow's own checks bound them, and the worker's round trip
would cost them more than half again their CPU on this project's machines (measured by
``benchmarks.bench_decode_bounds``). Every other format, where plugins learn sizes late, goes to
the worker.

The answer crosses the pipe as a JSON header and raw bytes, never as a pickle: the child has
handled untrusted input, so nothing it sends is executed.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, BinaryIO

from PIL import Image

from beam_pipelines.image.formats import sniff_format
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.pillow_blocks import keep_freed_blocks
from beam_pipelines.image.prepare import PreparedImage, RejectedImage, prepare_image

__all__ = ["IN_PROCESS_FORMATS", "BoundedPreparer", "serve"]

# Formats whose decoders allocate pixel memory only for the size their header declares.
IN_PROCESS_FORMATS = frozenset({"JPEG", "PNG", "WEBP"})
# What preparing an image may hold per declared pixel: the decoded RGBA and its resized copies.
_BYTES_PER_PIXEL = 8

_LENGTH = struct.Struct("!Q")  # a frame's length
_HEAD = struct.Struct("!I")  # its JSON header's length
# The top-level directory holding the project's packages, for the child's import path.
_ROOT = str(Path(__file__).resolve().parents[2])
# The child imports the image modules without running beam_pipelines/__init__ (which imports
# Apache Beam: 1.5 s and 100 MB of address space the budget would pay for).
_BOOT = (
    "import sys, types\n"
    f"sys.path.insert(0, {_ROOT!r})\n"
    "package = types.ModuleType('beam_pipelines')\n"
    f"package.__path__ = [{str(Path(_ROOT) / 'beam_pipelines')!r}]\n"
    "sys.modules['beam_pipelines'] = package\n"
    "from beam_pipelines.image.bounds import serve\n"
    "serve()\n"
)
# One thread per math library: each thread's stack and arena is address space the budget pays.
_CHILD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "2",
}
_PIPE_BYTES = 1 << 20
_STARTUP_S = 60.0  # a child that has not said it is ready by then is broken, not slow


def _pillow_limit(max_pixels: int) -> int:
    # Pillow raises DecompressionBombError above twice its limit: this makes that --max_pixels.
    return max(1, -(-max_pixels // 2))


def _write_frame(fd: int, *parts: bytes) -> None:
    """Writes ``parts`` as one frame: their total length, then each part, without joining them."""
    pending = [_LENGTH.pack(sum(map(len, parts))), *parts]
    while pending:
        written = os.writev(fd, pending)
        while pending and written >= len(pending[0]):
            written -= len(pending[0])
            pending.pop(0)
        if written:
            pending[0] = pending[0][written:]


def _widen(fd: int) -> None:
    # A pipe holds 64 KiB by default: a photo would cross it in several wake-ups of each side.
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass  # above the system's pipe-max-size: the default still works, a little slower


def _read_exact(stream: BinaryIO, n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError(f"expected {n} bytes, got {0 if data is None else len(data)}")
    return data


def _answer(data: bytes, options: ImageOptions) -> tuple[dict[str, Any], bytes, bytes]:
    """The child's answer for one image: a JSON-able header, the encoded image, the sample."""
    try:
        prepared = prepare_image(data, options)
    except RejectedImage as e:
        if isinstance(e.__cause__, MemoryError):
            detail = f"{e.detail}: needs more than --decode_memory_mb {options.decode_memory_mb}"
            return {"reason": "over_budget", "detail": detail}, b"", b""
        return {"reason": e.reason, "detail": e.detail}, b"", b""
    header = {
        "format": prepared.format,
        "height": prepared.height,
        "width": prepared.width,
        "channels": prepared.channels,
        "source_format": prepared.source_format,
        "source_size": list(prepared.source_size),
        "decoded_size": list(prepared.decoded_size),
        "events": list(prepared.events),
    }
    return header, prepared.encoded, prepared.luma_sample or b""


def serve() -> None:
    """The decode worker's loop (run in the child): options first, then image after image.

    Reads a pickled ``ImageOptions`` from the parent (which it trusts), caps its own address
    space, then answers each image with one frame (a JSON header, the encoded image, the luma
    sample) until its input ends. A parent gone mid-image (a build interrupted or its worker
    killed) ends it quietly: there is nobody left to answer, and a traceback on the user's
    terminal would look like the cause.
    """
    try:
        _serve()
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return


def _serve() -> None:
    stdin, out = sys.stdin.buffer, sys.stdout.fileno()
    _widen(out)
    (length,) = _LENGTH.unpack(_read_exact(stdin, _LENGTH.size))
    options: ImageOptions = pickle.loads(_read_exact(stdin, length))
    Image.MAX_IMAGE_PIXELS = _pillow_limit(options.max_pixels)  # this process only
    warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # --max_pixels decides
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    budget = options.decode_memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (budget, budget))
    _write_frame(out, _HEAD.pack(0))
    while True:
        head = stdin.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return  # the parent closed the pipe: nothing more to do
        (length,) = _LENGTH.unpack(head)
        header, encoded, sample = _answer(_read_exact(stdin, length), options)
        header["lengths"] = [len(encoded), len(sample)]
        text = json.dumps(header).encode()
        _write_frame(out, _HEAD.pack(len(text)), text, encoded, sample)


class _Child:
    """One running decode worker and the pipes to it."""

    def __init__(self, options: ImageOptions) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, **_CHILD_ENV},
            bufsize=0,
            # Its own process group: a terminal's Ctrl-C is for the command, which ends this
            # worker (closing its input), not for the worker to die of with a traceback.
            process_group=0,
        )
        self._in = self.process.stdin.fileno()  # type: ignore[union-attr]  # PIPE given
        self._out = self.process.stdout.fileno()  # type: ignore[union-attr]  # PIPE given
        _widen(self._in)
        _write_frame(self._in, pickle.dumps(options))
        if self.read_frame(time.monotonic() + _STARTUP_S) != _HEAD.pack(0):
            raise RuntimeError("the decode worker did not start")

    def send(self, data: bytes) -> None:
        _write_frame(self._in, data)

    def read_frame(self, deadline: float) -> memoryview | None:
        """The next frame the child writes, or None when the deadline passes first.

        Raises:
          EOFError: if the child closed its end (it died).
        """
        head = self._read(_LENGTH.size, deadline)
        if head is None:
            return None
        (length,) = _LENGTH.unpack(head)
        return self._read(length, deadline)

    def _read(self, n: int, deadline: float) -> memoryview | None:
        buffer = memoryview(bytearray(n))
        got = 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out], [], [], left)[0]:
                return None
            chunk = os.readv(self._out, [buffer[got:]])
            if not chunk:
                raise EOFError("the decode worker closed its output")
            got += chunk
        return buffer

    def stop(self) -> int:
        """Ends the child (killed if need be) and returns its exit status."""
        if self.process.poll() is None:
            self.process.kill()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()
        return self.process.wait()


def _prepared(frame: memoryview) -> PreparedImage:
    """The ``PreparedImage`` a child's frame holds.

    Raises:
      RejectedImage: the rejection it holds instead.
    """
    (length,) = _HEAD.unpack_from(frame)
    start = _HEAD.size + length
    answer = json.loads(bytes(frame[_HEAD.size : start]))
    if "reason" in answer:
        raise RejectedImage(answer["reason"], answer["detail"])
    encoded_length, sample_length = answer["lengths"]
    encoded = bytes(frame[start : start + encoded_length])
    sample = bytes(frame[start + encoded_length : start + encoded_length + sample_length])
    return PreparedImage(
        encoded=encoded,
        format=answer["format"],
        height=answer["height"],
        width=answer["width"],
        channels=answer["channels"],
        source_format=answer["source_format"],
        source_size=tuple(answer["source_size"]),
        decoded_size=tuple(answer["decoded_size"]),
        luma_sample=sample or None,
        events=tuple(answer["events"]),
    )


class BoundedPreparer:
    """``prepare_image`` in a decode worker held within a memory and a time budget.

    The worker starts on the first image and serves the next ones; an image that breaks a
    budget (or kills the worker) is rejected and the next image starts a fresh worker. Not
    thread-safe: one per thread (a Beam DoFn instance has one).

    Args:
      options: how to prepare each image, with ``decode_memory_mb`` and ``decode_time_s``.
    """

    def __init__(self, options: ImageOptions) -> None:
        self._options = options
        self._child: _Child | None = None
        # In process only while --max_pixels keeps such an image within the memory budget and
        # within Pillow's own limit here (the worker sets that from --max_pixels).
        pillow_limit = Image.MAX_IMAGE_PIXELS
        self._in_process = options.max_pixels * _BYTES_PER_PIXEL <= (
            options.decode_memory_mb << 20
        ) and (pillow_limit is None or options.max_pixels <= 2 * pillow_limit)
        if self._in_process:
            keep_freed_blocks()  # images prepared here reuse the pixel memory of the last ones

    def prepare(self, data: bytes) -> PreparedImage:
        """``prepare_image(data, options)``, within the budgets.

        Raises:
          RejectedImage: as ``prepare_image`` does, and ``over_budget`` for an image that needs
            more memory or time than its budget, ``decoder_crashed`` for one whose decode
            killed the worker.
        """
        if self._in_process and sniff_format(data) in IN_PROCESS_FORMATS:
            return prepare_image(data, self._options)
        child = self._child or _Child(self._options)
        self._child = child
        deadline = time.monotonic() + self._options.decode_time_s
        try:
            child.send(data)
            frame = child.read_frame(deadline)
        except (EOFError, BrokenPipeError) as e:
            self._child = None
            raise self._died(child.stop()) from e
        if frame is None:
            self._child = None
            child.stop()
            raise RejectedImage(
                "over_budget",
                f"preparing it took more than the --decode_time_s {self._options.decode_time_s:g}"
                " s budget; it was stopped",
            )
        return _prepared(frame)

    def _died(self, status: int) -> RejectedImage:
        budget = f"--decode_memory_mb {self._options.decode_memory_mb} MB"
        if status == -signal.SIGKILL:  # the kernel's OOM killer, or someone else's kill
            return RejectedImage("over_budget", f"the decode worker was killed ({budget})")
        name = f"exit status {status}"
        if status < 0:
            name = signal.Signals(-status).name if -status in signal.valid_signals() else name
        return RejectedImage(
            "decoder_crashed", f"the decode worker died of {name} while decoding ({budget})"
        )

    def worker_pid(self) -> int | None:
        """The running worker's process id (for measuring it), or None before the first image."""
        return self._child.process.pid if self._child is not None else None

    def close(self) -> None:
        """Stops the worker, if one runs."""
        if self._child is not None:
            self._child.stop()
            self._child = None

    def __del__(self) -> None:
        self.close()
