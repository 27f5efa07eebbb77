"""The per-example image step of the PyTorch loader: stored bytes -> a uint8 crop, in place.

The same step as the TensorFlow reader's (``tfrecord_io.decode``: ``random_window``,
``_center_window``, ``decode_one_jpeg``, ``_decode_raw``), without TensorFlow:

* training: an Inception-style random resized crop (area fraction in ``area_range``, aspect
  ratio log-uniform in ``aspect_ratio_range``, up to 10 attempts, else the whole image), a
  bilinear resize to ``image_size`` square and a horizontal flip with probability 1/2;
* eval: the centre square of ``image_size / (image_size + CROP_PADDING)`` of the shorter side,
  resized to ``image_size``;
* RAW (uint8 HWC of ``stored_size`` square): a random (training) or centred (eval)
  ``image_size`` crop, flipped in training; a bilinear upscale when ``stored_size`` is smaller.

``decode_into`` writes the result into a caller's ``(image_size, image_size, 3)`` uint8 array,
typically one row of a preallocated ``(B, S, S, 3)`` batch; ``normalize_batch`` turns such a
batch into normalised float32 (HWC or CHW) in two passes. Randomness comes only from the
per-example ``seed`` (BLAKE2b of it, not a global generator), so augmentation replays exactly
after a resume.

Why these libraries (``benchmarks/bench_torch_decode.py`` measures them):

* JPEG: libjpeg-turbo through ``simplejpeg`` (decoding into a reused per-thread buffer), with
  the fast IDCT and fast chroma upsampling by default. When a TurboJPEG 3 library is found (its
  public C API, through ctypes: ``TFRECORD_IO_TURBOJPEG`` names the file, else the system's
  ``libturbojpeg``), only the rows and columns of the crop window are decoded
  (``tj3SetCroppingRegion``), as the TensorFlow reader's ``decode_and_crop_jpeg`` does. Debian's
  libturbojpeg is 2.1, so there the whole image is decoded and the window cut from it. The
  window saves less than its area suggests (about 20 % of a decode for a window of 45 % of the
  image): entropy decoding, which every row above the window's bottom still needs, is most of
  the cost of a quality-90 JPEG.
* crop, resize and flip: OpenCV's ``INTER_LINEAR`` (half-pixel centres, no antialiasing: the
  TensorFlow reader's ``tf.image.resize(..., "bilinear", antialias=False)``) straight into the
  caller's array, and ``cv2.flip`` in place.
* anything else (PNG, GIF, BMP, CMYK JPEG): Pillow, converted to RGB, then the same crop.

OpenCV may start threads of its own for one resize; loader workers that each decode one image
at a time should call ``cv2.setNumThreads(1)``, as they call ``torch.set_num_threads(1)``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import hashlib
import io
import math
import operator
import os
import struct
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import cv2
import numpy as np
import simplejpeg
from PIL import Image

from schemas.constants import CROP_PADDING, MEAN_RGB, STDDEV_RGB
from schemas.constants import ENCODINGS as STORED_ENCODINGS

if TYPE_CHECKING:
    import torch

__all__ = [
    "CROP_PADDING",
    "DCT_METHODS",
    "ENCODINGS",
    "MEAN_RGB",
    "STDDEV_RGB",
    "TURBOJPEG_ENV",
    "LAYOUTS",
    "CropWindow",
    "ImageSpec",
    "center_crop_window",
    "decode_into",
    "jpeg_decoder",
    "normalize_batch",
    "random_crop_window",
]

# The TensorFlow reader's encodings and IDCT methods (tfrecord_io.decode imports TensorFlow, so
# they are repeated here; tests/test_torch_image.py checks they agree).
ENCODINGS = (*STORED_ENCODINGS, "auto")
DCT_METHODS = ("", "INTEGER_FAST", "INTEGER_ACCURATE")
#: Environment variable naming a TurboJPEG 3 library file (``libturbojpeg.so.0`` of
#: libjpeg-turbo >= 3.0) to decode only the crop window with.
TURBOJPEG_ENV = "TFRECORD_IO_TURBOJPEG"

_MAX_ATTEMPTS = 10  # random-resized-crop tries before taking the whole image
_JPEG_MAGIC = b"\xff\xd8\xff"
# A decode buffer of at most this many bytes is kept per thread and reused; larger images get
# a buffer of their own, so that one huge foreign image does not pin its memory.
_KEPT_BUFFER_BYTES = 16 * 1024 * 1024


def _check_range(name: str, value: Any, upper: float | None) -> None:
    ok = isinstance(value, tuple) and len(value) == 2
    ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not ok or not 0.0 < value[0] <= value[1] or (upper is not None and value[1] > upper):
        bound = f"0 < lo <= hi <= {upper}" if upper is not None else "0 < lo <= hi"
        raise ValueError(f"{name} must be a (lo, hi) tuple with {bound}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """How one stored image becomes one ``image_size`` square uint8 crop.

    The fields and their meaning are ``tfrecord_io.decode.DecodeConfig``'s. (Not
    ``schemas.ImageSpec``, which says how a dataset's images were stored.)

    Attributes:
      image_size: output side length.
      training: random resized crops and flips if True, the centre crop otherwise.
      encoding: stored encoding, one of ``ENCODINGS``. Every encoding but ``raw`` is sniffed
        per example: JPEG takes the fast path, anything else Pillow reads the generic one.
      stored_size: side length of stored RAW images (required for ``raw``).
      area_range, aspect_ratio_range: the random-resized-crop distribution for training.
      jpeg_dct_method: the libjpeg IDCT; ``INTEGER_FAST`` (the default, as the TensorFlow
        reader's) trades a little accuracy for speed, ``""`` and ``INTEGER_ACCURATE`` are
        libjpeg's accurate default.
      jpeg_fast_upsampling: upsample chroma by replication rather than libjpeg's "fancy"
        interpolation: about 10 % less decode time, colour edges a little blockier.
      crop_decode: decode only the crop window's rows and columns when a TurboJPEG 3 library is
        available (``jpeg_decoder``); the pixels are the same up to rounding at the window's
        left edge.
    """

    image_size: int
    training: bool
    encoding: str = "jpeg"
    stored_size: int | None = None
    area_range: tuple[float, float] = (0.08, 1.0)
    aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3)
    jpeg_dct_method: str = "INTEGER_FAST"
    jpeg_fast_upsampling: bool = True
    crop_decode: bool = True

    def __post_init__(self) -> None:
        size = self.image_size
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"image_size must be a positive int, got {size!r}")
        for name in ("training", "jpeg_fast_upsampling", "crop_decode"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        stored = self.stored_size
        if stored is not None and (not isinstance(stored, int) or isinstance(stored, bool)):
            raise ValueError(f"stored_size must be a positive int or None, got {stored!r}")
        if (stored is not None and stored <= 0) or (self.encoding == "raw" and stored is None):
            raise ValueError(
                f"RAW decoding needs the stored image size, got stored_size={stored!r}"
            )
        _check_range("area_range", self.area_range, 1.0)
        _check_range("aspect_ratio_range", self.aspect_ratio_range, None)
        if self.jpeg_dct_method not in DCT_METHODS:
            raise ValueError(
                f"jpeg_dct_method must be one of {DCT_METHODS}, got {self.jpeg_dct_method!r}"
            )


class CropWindow(NamedTuple):
    """A crop of an image: rows ``[y, y + height)``, columns ``[x, x + width)``, and whether
    the output is flipped left-right."""

    y: int
    x: int
    height: int
    width: int
    flip: bool


# -- Randomness: a per-example stream of uniforms from the seed alone ------------------------

_UINT64 = (1 << 64) - 1
_EIGHT_UINT64 = struct.Struct("<8Q").unpack
_TO_UNIT = 2.0**-53


def _uniforms(seed: int) -> Iterator[float]:
    """An endless stream of floats in [0, 1), a function of ``seed`` alone.

    Block ``k`` of 8 numbers is BLAKE2b(seed as 8 little-endian bytes, person=k): about 2 us
    for the first block, where numpy's ``Generator(Philox(key=seed))`` costs about 16 us to
    construct. Negative seeds (int64 seeds of the TensorFlow reader) are taken mod 2**64.
    """
    key = (operator.index(seed) & _UINT64).to_bytes(8, "little")
    block = 0
    while True:
        person = block.to_bytes(8, "little")
        for word in _EIGHT_UINT64(hashlib.blake2b(key, person=person).digest()):
            yield (word >> 11) * _TO_UNIT
        block += 1


def random_crop_window(height: int, width: int, seed: int, spec: ImageSpec) -> CropWindow:
    """The training crop of a ``height`` x ``width`` image for ``seed``.

    torchvision's ``RandomResizedCrop.get_params``: up to 10 tries of an area fraction uniform
    in ``spec.area_range`` and an aspect ratio log-uniform in ``spec.aspect_ratio_range``,
    kept when it fits; otherwise the whole image (as the TensorFlow reader's
    ``sample_distorted_bounding_box(use_image_if_no_bounding_boxes=True)``). The flip is the
    stream's first number, so it does not depend on how many tries the crop took.
    """
    stream = _uniforms(seed)
    flip = next(stream) < 0.5
    area = height * width
    area_lo, area_hi = spec.area_range
    log_lo, log_hi = (math.log(r) for r in spec.aspect_ratio_range)
    for _ in range(_MAX_ATTEMPTS):
        target = area * (area_lo + (area_hi - area_lo) * next(stream))
        ratio = math.exp(log_lo + (log_hi - log_lo) * next(stream))
        crop_w = round(math.sqrt(target * ratio))
        crop_h = round(math.sqrt(target / ratio))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            y = int(next(stream) * (height - crop_h + 1))
            x = int(next(stream) * (width - crop_w + 1))
            return CropWindow(y, x, crop_h, crop_w, flip)
    return CropWindow(0, 0, height, width, flip)


def center_crop_window(height: int, width: int, image_size: int) -> CropWindow:
    """The eval crop: the centred square of ``image_size / (image_size + CROP_PADDING)`` of the
    shorter side (224 of 256), rounded half to even as ``tf.round``; never flipped."""
    side = max(round(image_size / (image_size + CROP_PADDING) * min(height, width)), 1)
    return CropWindow((height - side + 1) // 2, (width - side + 1) // 2, side, side, False)


def _window(height: int, width: int, seed: int | None, spec: ImageSpec) -> CropWindow:
    if spec.training:
        assert seed is not None  # decode_into checks
        return random_crop_window(height, width, seed, spec)
    return center_crop_window(height, width, spec.image_size)


# -- Resizing into the caller's array -------------------------------------------------------


def _resize_into(pixels: np.ndarray, out: np.ndarray, flip: bool) -> None:
    """``pixels`` (HWC uint8, any row stride) resized bilinearly into ``out``, flipped if asked.

    ``cv2.resize`` writes into ``dst`` only when its shape and type already match, which
    ``decode_into`` checked; a window of the output's size is copied (or flipped) in one pass.
    """
    size = out.shape[0]
    if pixels.shape[0] == size and pixels.shape[1] == size:
        if flip:
            cv2.flip(pixels, 1, dst=out)
        else:
            np.copyto(out, pixels)
        return
    cv2.resize(pixels, (size, size), dst=out, interpolation=cv2.INTER_LINEAR)
    if flip:
        cv2.flip(out, 1, dst=out)


def _crop(pixels: np.ndarray, window: CropWindow) -> np.ndarray:
    return pixels[window.y : window.y + window.height, window.x : window.x + window.width]


# -- Decode buffers, one per thread ---------------------------------------------------------

_local = threading.local()


def _buffer(nbytes: int) -> np.ndarray:
    """A uint8 buffer of at least ``nbytes`` for this thread's next decode."""
    if nbytes > _KEPT_BUFFER_BYTES:
        return np.empty(nbytes, np.uint8)
    buffer: np.ndarray | None = getattr(_local, "buffer", None)
    if buffer is None or buffer.size < nbytes:
        buffer = np.empty(max(nbytes, 1 << 20), np.uint8)
        _local.buffer = buffer
    return buffer


# -- TurboJPEG 3 through its public C API: decoding only the crop window --------------------

# From libjpeg-turbo 3's turbojpeg.h.
_TJINIT_DECOMPRESS = 1
_TJPARAM_STOPONWARNING, _TJPARAM_SUBSAMP = 0, 4
_TJPARAM_JPEGWIDTH, _TJPARAM_JPEGHEIGHT, _TJPARAM_COLORSPACE = 5, 6, 8
_TJPARAM_FASTUPSAMPLE, _TJPARAM_FASTDCT = 9, 10
_TJPF_RGB = 0
_TJCS_CMYK, _TJCS_YCCK = 3, 4
# TJSAMP_444, 422, 420, GRAY, 440, 411, 441 -> the iMCU width a cropping region's left edge
# must be a multiple of; TJSAMP_UNKNOWN (-1) is not croppable.
_IMCU_WIDTH = {0: 8, 1: 16, 2: 16, 3: 8, 4: 8, 5: 32, 6: 8}


class _TjRegion(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _TurboJpeg3:
    """libjpeg-turbo 3's TurboJPEG API, loaded with ctypes; one decompressor per thread.

    TurboJPEG reports every failure as a return value with a message (``tj3GetErrorStr``),
    which ctypes can take, unlike the libjpeg API's ``longjmp``; with ``TJPARAM_STOPONWARNING``
    a truncated or corrupt stream fails instead of decoding grey.
    """

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        if not hasattr(lib, "tj3SetCroppingRegion"):
            raise OSError(f"{path} is not TurboJPEG 3 (it has no tj3SetCroppingRegion)")
        handle, buf, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        lib.tj3Init.restype = handle
        lib.tj3Init.argtypes = [ctypes.c_int]
        lib.tj3Destroy.argtypes = [handle]
        lib.tj3Set.argtypes = [handle, ctypes.c_int, ctypes.c_int]
        lib.tj3Get.argtypes = [handle, ctypes.c_int]
        lib.tj3GetErrorStr.restype = ctypes.c_char_p
        lib.tj3GetErrorStr.argtypes = [handle]
        lib.tj3DecompressHeader.argtypes = [handle, buf, size]
        lib.tj3SetCroppingRegion.argtypes = [handle, _TjRegion]
        lib.tj3Decompress8.argtypes = [
            handle,
            buf,
            size,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
        ]
        self.lib, self.path = lib, path
        self._local = threading.local()

    def _handle(self) -> int:
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self.lib.tj3Init(_TJINIT_DECOMPRESS)
            if not handle:
                raise MemoryError("tj3Init failed")
            self.lib.tj3Set(handle, _TJPARAM_STOPONWARNING, 1)
            # Freed when the thread's locals go (the object dies with the thread).
            self._local.handle = handle
            self._local.closer = _TjCloser(self.lib, handle)
        return handle

    def _fail(self, handle: int, what: str) -> ValueError:
        message = self.lib.tj3GetErrorStr(handle).decode(errors="replace")
        return ValueError(f"cannot decode JPEG ({what}): {message}")

    def header(self, data: bytes) -> tuple[int, int, int, int]:
        """``(height, width, TJSAMP, TJCS)`` of a JPEG, raising ValueError if unreadable."""
        handle, lib = self._handle(), self.lib
        if lib.tj3DecompressHeader(handle, data, len(data)) != 0:
            raise self._fail(handle, "header")
        get = lib.tj3Get
        height, width = get(handle, _TJPARAM_JPEGHEIGHT), get(handle, _TJPARAM_JPEGWIDTH)
        return height, width, get(handle, _TJPARAM_SUBSAMP), get(handle, _TJPARAM_COLORSPACE)

    def decode_window(
        self, data: bytes, window: CropWindow, subsamp: int, spec: ImageSpec
    ) -> np.ndarray:
        """RGB pixels of ``window`` only, after ``header(data)`` on this thread."""
        handle, lib = self._handle(), self.lib
        lib.tj3Set(handle, _TJPARAM_FASTDCT, int(spec.jpeg_dct_method == "INTEGER_FAST"))
        lib.tj3Set(handle, _TJPARAM_FASTUPSAMPLE, int(spec.jpeg_fast_upsampling))
        y, x, height, width = window.y, window.x, window.height, window.width
        imcu = _IMCU_WIDTH.get(subsamp)
        if imcu is None:  # an unusual sampling: decode every row and column
            full_h = lib.tj3Get(handle, _TJPARAM_JPEGHEIGHT)
            full_w = lib.tj3Get(handle, _TJPARAM_JPEGWIDTH)
            left, region = x, _TjRegion(0, 0, 0, 0)
            rows, cols = full_h, full_w
        else:  # the left edge moves left to an iMCU boundary; the extra columns are cut after
            left = x % imcu
            region = _TjRegion(x - left, y, width + left, height)
            rows, cols = height, width + left
        if lib.tj3SetCroppingRegion(handle, region) != 0:
            raise self._fail(handle, "crop window")
        buffer = _buffer(rows * cols * 3)
        status = lib.tj3Decompress8(
            handle, data, len(data), buffer.ctypes.data, cols * 3, _TJPF_RGB
        )
        if status != 0:
            raise self._fail(handle, f"{len(data)} bytes")
        pixels = buffer[: rows * cols * 3].reshape(rows, cols, 3)
        if imcu is None:
            return pixels[y : y + height, left : left + width]
        return pixels[:, left : left + width]


class _TjCloser:
    """Destroys a thread's TurboJPEG handle when the thread's locals are released."""

    def __init__(self, lib: Any, handle: int) -> None:
        self.lib, self.handle = lib, handle

    def __del__(self) -> None:
        self.lib.tj3Destroy(self.handle)


_turbojpeg3: _TurboJpeg3 | None = None
_turbojpeg3_searched = False
_turbojpeg3_lock = threading.Lock()


def _find_turbojpeg3() -> _TurboJpeg3 | None:
    """The TurboJPEG 3 library (``TURBOJPEG_ENV``, else the system's), or None, found once."""
    global _turbojpeg3, _turbojpeg3_searched
    if _turbojpeg3_searched:
        return _turbojpeg3
    with _turbojpeg3_lock:
        if not _turbojpeg3_searched:
            path = os.environ.get(TURBOJPEG_ENV) or ctypes.util.find_library("turbojpeg")
            try:
                _turbojpeg3 = _TurboJpeg3(path) if path else None
            except OSError as e:
                if os.environ.get(TURBOJPEG_ENV):  # asked for by name: say why not
                    raise ValueError(f"{TURBOJPEG_ENV}={path!r} cannot be used: {e}") from e
                _turbojpeg3 = None  # a TurboJPEG 2 system library: decode whole images
            _turbojpeg3_searched = True
    return _turbojpeg3


def jpeg_decoder(spec: ImageSpec) -> str:
    """Which JPEG decoder ``decode_into`` uses with ``spec``: ``"turbojpeg3-crop <path>"``
    (only the crop window is decoded) or ``"simplejpeg"`` (the whole image).

    Raises:
      ValueError: ``TFRECORD_IO_TURBOJPEG`` names a file that is not a TurboJPEG 3 library.
    """
    library = _find_turbojpeg3() if spec.crop_decode else None
    return f"turbojpeg3-crop {library.path}" if library is not None else "simplejpeg"


# -- The decode paths -----------------------------------------------------------------------


def _jpeg_into(data: bytes, out: np.ndarray, seed: int | None, spec: ImageSpec) -> None:
    library = _find_turbojpeg3() if spec.crop_decode else None
    if library is not None:
        height, width, subsamp, colorspace = library.header(data)
        if colorspace in (_TJCS_CMYK, _TJCS_YCCK):
            _pillow_into(data, out, seed, spec)
            return
        window = _window(height, width, seed, spec)
        _resize_into(library.decode_window(data, window, subsamp, spec), out, window.flip)
        return
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as e:
        raise ValueError(f"cannot decode JPEG (header of {len(data)} bytes): {e}") from e
    if colorspace in ("CMYK", "YCCK"):  # Pillow converts these to RGB as image viewers do
        _pillow_into(data, out, seed, spec)
        return
    window = _window(height, width, seed, spec)
    try:
        pixels = simplejpeg.decode_jpeg(
            data,
            colorspace="RGB",
            fastdct=spec.jpeg_dct_method == "INTEGER_FAST",
            fastupsample=spec.jpeg_fast_upsampling,
            buffer=_buffer(height * width * 3),
        )
    except ValueError as e:
        raise ValueError(f"cannot decode JPEG ({len(data)} bytes): {e}") from e
    _resize_into(_crop(pixels, window), out, window.flip)


def _pillow_into(data: bytes, out: np.ndarray, seed: int | None, spec: ImageSpec) -> None:
    """Anything Pillow reads (PNG, GIF, BMP, WebP, CMYK JPEG): first frame, as RGB.

    EXIF orientation is not applied, as the TensorFlow reader does not apply it.
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            pixels = np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        # Pillow's UnidentifiedImageError is an OSError; truncated files raise OSError too.
        raise ValueError(
            f"cannot decode image ({len(data)} bytes starting {data[:8]!r}): {e}"
        ) from e
    window = _window(pixels.shape[0], pixels.shape[1], seed, spec)
    _resize_into(_crop(pixels, window), out, window.flip)


def _raw_into(
    data: bytes | bytearray | memoryview, out: np.ndarray, seed: int | None, spec: ImageSpec
) -> None:
    """A RAW uint8 HWC image: the TensorFlow reader's ``_decode_raw`` for one example."""
    stored, size = spec.stored_size, spec.image_size
    assert stored is not None  # checked in ImageSpec
    if len(data) != stored * stored * 3:
        raise ValueError(
            f"RAW image has {len(data)} bytes, expected {stored}*{stored}*3 = "
            f"{stored * stored * 3} for stored_size={stored}"
        )
    pixels = np.frombuffer(data, np.uint8).reshape(stored, stored, 3)
    if spec.training:  # the flip first, then the corner: as random_crop_window's stream
        assert seed is not None  # decode_into checks
        stream = _uniforms(seed)
        flip = next(stream) < 0.5
        y, x = (int(next(stream) * (stored - size + 1)) for _ in range(2))
    else:
        flip, y, x = False, (stored - size) // 2, (stored - size) // 2
    if size < stored:
        pixels = pixels[y : y + size, x : x + size]
    _resize_into(pixels, out, flip)


def _check_out(out: Any, size: int) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out.shape != (size, size, 3) or out.dtype != np.uint8:
        raise ValueError(
            f"out must be uint8 of shape ({size}, {size}, 3), got {out.dtype} {out.shape}"
        )
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be C-contiguous and writeable (a row of a (B, S, S, 3) batch)")


def decode_into(
    encoded: bytes | bytearray | memoryview,
    out: np.ndarray,
    *,
    seed: int | None,
    spec: ImageSpec,
) -> None:
    """Decodes one stored image into ``out``: its (random or centre) crop, resized, flipped.

    Thread-safe; the decoders release the GIL. ``out`` is typically ``batch[i]`` of a
    preallocated ``(B, S, S, 3)`` uint8 array (``tensor.numpy()`` of a uint8 tensor works too).

    Args:
      encoded: the stored bytes (``image/encoded``).
      out: uint8 ``(image_size, image_size, 3)``, C-contiguous, written in place (HWC, RGB).
      seed: the example's seed (any int; taken mod 2**64); required in training, where it
        alone decides the crop and the flip. Ignored in eval.
      spec: the decode options.

    Raises:
      ValueError: the bytes are empty, truncated or not an image (the message names the
        decoder's complaint and the first bytes), a RAW image has the wrong size, ``out`` has
        the wrong shape or dtype, or training has no seed.
      TypeError: ``out`` is not a numpy array.
    """
    _check_out(out, spec.image_size)
    if spec.training and seed is None:
        raise ValueError("training decode needs the example's seed, got seed=None")
    if not len(encoded):
        raise ValueError("cannot decode an empty image (0 bytes)")
    if spec.encoding == "raw":  # read in place: a view of the record is not copied
        _raw_into(encoded, out, seed, spec)
        return
    data = encoded if isinstance(encoded, bytes) else bytes(encoded)
    if data.startswith(_JPEG_MAGIC):
        _jpeg_into(data, out, seed, spec)
    else:
        _pillow_into(data, out, seed, spec)


# -- The batch step -------------------------------------------------------------------------


LAYOUTS = ("HWC", "CHW")


def normalize_batch(
    images: Any, *, layout: str = "HWC", out: torch.Tensor | None = None
) -> torch.Tensor:
    """uint8 RGB ``(B, H, W, 3)`` -> float32 ``(pixel - MEAN_RGB) / STDDEV_RGB``, contiguous.

    Two passes over the float32 output: the conversion (transposing for ``CHW``), then one
    in-place multiply-add. For ``HWC`` the per-channel constants are tiled along whole rows,
    so the multiply-add runs on contiguous rows rather than broadcasting a 3-vector; together
    about a tenth of the CPU of ``(images.float() - mean) / std`` (``bench_torch_decode``).
    Prefer normalising on the accelerator where there is one (uint8 is a quarter of the bytes).

    Args:
      images: a uint8 numpy array or tensor ``(B, H, W, 3)`` (what ``decode_into`` filled).
      layout: ``HWC`` gives ``(B, H, W, 3)``, ``CHW`` gives ``(B, 3, H, W)``.
      out: optional contiguous float32 tensor of that shape to write into.

    Returns:
      ``out`` (or a new tensor) holding the normalised batch.

    Raises:
      ValueError: ``images`` is not uint8 ``(B, H, W, 3)``, ``layout`` is not one of
        ``LAYOUTS``, or ``out`` does not match.
    """
    import torch  # here, so that decoding alone needs no torch

    batch = torch.from_numpy(images) if isinstance(images, np.ndarray) else images
    if batch.dtype != torch.uint8 or batch.dim() != 4 or batch.shape[3] != 3:
        raise ValueError(
            f"images must be uint8 (B, H, W, 3), got {batch.dtype} {tuple(batch.shape)}"
        )
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    count, height, width, _ = batch.shape
    shape = (count, height, width, 3) if layout == "HWC" else (count, 3, height, width)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif tuple(out.shape) != shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(
            f"out must be contiguous float32 {shape}, got {out.dtype} {tuple(out.shape)}"
        )
    scale = torch.tensor([1.0 / s for s in STDDEV_RGB])
    offset = torch.tensor([-m / s for m, s in zip(MEAN_RGB, STDDEV_RGB, strict=True)])
    if layout == "HWC":
        out.copy_(batch)
        rows = out.view(-1, width * 3)
        rows.mul_(scale.repeat(width)).add_(offset.repeat(width))
    else:
        out.copy_(batch.permute(0, 3, 1, 2))
        out.mul_(scale.view(1, 3, 1, 1)).add_(offset.view(1, 3, 1, 1))
    return out
