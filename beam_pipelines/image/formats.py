"""Which image formats the pipeline accepts, how they are recognised, and why a file failed.

The accepted formats are an explicit list (``DEFAULT_ACCEPTED_FORMATS``): every raster format
that Pillow decodes by itself, with no external program. ``EXCLUDED_FORMATS`` names the formats
Pillow recognises that are left out, and why. ``--accepted_formats`` widens or narrows the list
(``parse_accepted_formats``).

``classify_error`` turns the exception Pillow raised for a file into one of the pipeline's
reason codes, so that a header that promises an unsupported feature, a compressed metadata bomb,
a header that contradicts itself and a file cut short are told apart.
"""

from __future__ import annotations

import re
import struct

from PIL import Image

__all__ = [
    "DEFAULT_ACCEPTED_FORMATS",
    "EXCLUDED_FORMATS",
    "NOT_DECODABLE",
    "pillow_formats",
    "sniff_format",
    "parse_accepted_formats",
    "why_not_accepted",
    "classify_error",
    "error_text",
]

# In the order they are tried: strong magic numbers first, TGA (which has none) last.
DEFAULT_ACCEPTED_FORMATS = (
    "JPEG",
    "MPO",  # a JPEG holding several pictures (3D cameras, some phones): its first one
    "PNG",
    "GIF",
    "WEBP",
    "BMP",
    "TIFF",
    "JPEG2000",
    "AVIF",
    "QOI",
    "PPM",
    "ICO",
    "CUR",
    "ICNS",
    "PSD",
    "DDS",
    "BLP",
    "FTEX",
    "PCX",
    "DCX",
    "SGI",
    "SUN",
    "MSP",
    "XBM",
    "XPM",
    "FITS",
    "FLI",
    "GBR",
    "PCD",
    "PIXAR",
    "MCIDAS",
    "SPIDER",
    "IM",
    "IMT",
    "XVTHUMB",
    "DIB",
    "TGA",
)

# Formats Pillow recognises that are not accepted unless --accepted_formats adds them.
EXCLUDED_FORMATS = {
    "EPS": "Pillow rasterises it with Ghostscript, an external program that runs PostScript",
    "WMF": "a vector format (WMF/EMF) that Pillow rasterises only on Windows",
    "IPTC": "its loader re-opens the embedded data as whatever format it looks like",
    "BUFR": "Pillow only identifies it; decoding needs an external handler",
    "GRIB": "Pillow only identifies it; decoding needs an external handler",
    "HDF5": "Pillow only identifies it; decoding needs an external handler",
    "MPEG": "video; Pillow reads only its header",
}

# Recognised here from their leading bytes, but Pillow cannot decode them at all.
NOT_DECODABLE = {
    "PDF": "a document format Pillow can write but not read",
    "HEIF": "HEIF/HEIC needs a Pillow plugin (pillow-heif) that is not installed",
    "JPEG XL": "Pillow has no JPEG XL decoder",
    "SVG": "a vector format Pillow does not rasterise",
}

_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"\x89PNG\r\n\x1a\n", "PNG"),
    (0, b"GIF87a", "GIF"),
    (0, b"GIF89a", "GIF"),
    (0, b"BM", "BMP"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG2000"),
    (0, b"qoif", "QOI"),
    (0, b"8BPS", "PSD"),
    (0, b"DDS ", "DDS"),
    (0, b"icns", "ICNS"),
    (0, b"SIMPLE  =", "FITS"),
    (0, b"%!PS", "EPS"),
    (0, b"\xc5\xd0\xd3\xc6", "EPS"),
    (0, b"%PDF-", "PDF"),
    (0, b"\xff\x0a", "JPEG XL"),
    (0, b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
)
_HEIF_BRANDS = (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1")

# Message patterns, checked in this order; the first match decides. Pillow's plugins raise
# plain OSError/ValueError/SyntaxError, so the message is all there is to go on.
_BOMB = re.compile(r"decompressed data too large|too much memory used in text chunks", re.I)
_UNSUPPORTED = re.compile(
    r"unsupported|not supported|not yet supported|support not installed|unknown \w+ mode"
    r"|unknown pixel mode|unknown tga map depth|unknown .*compression|cannot handle"
    r"|decoder \S+ not available|unrecognized .*mode",
    re.I,
)
_TRUNCATED = re.compile(
    r"truncat|end of file|\beof\b|not enough data|ran out of data|unexpected end|"
    r"buffer is not large enough|unpack requires a buffer|premature end",
    re.I,
)


def pillow_formats() -> tuple[str, ...]:
    """Every format Pillow can open in this installation (``Image.OPEN`` plus MPO)."""
    Image.init()
    return tuple(sorted({*Image.OPEN, "MPO"}))


def sniff_format(data: bytes) -> str | None:
    """Names the format announced by the leading bytes, or None if none is recognised.

    The extension is never consulted: a PNG saved as ``.JPEG`` is a known ImageNet case. Besides
    Pillow's formats, this names PDF, HEIF, JPEG XL and SVG, which Pillow cannot decode, so that
    their rejection says what they are.
    """
    for offset, magic, name in _MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        if brand in (b"avif", b"avis"):
            return "AVIF"
        if brand in _HEIF_BRANDS:
            return "HEIF"
    head = data[:1024].lstrip().lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in head):
        return "SVG"
    return None


def parse_accepted_formats(text: str) -> tuple[str, ...]:
    """Parses ``--accepted_formats``: the formats the pipeline accepts, in the order tried.

    Forms (names are Pillow's, case-insensitive, comma-separated):
      ``default``: ``DEFAULT_ACCEPTED_FORMATS``;
      ``JPEG,PNG``: exactly these;
      ``+EPS,-TGA`` or ``default,+EPS,-TGA``: the default list with EPS added and TGA removed
      (on a command line, a value starting with ``-`` needs ``--accepted_formats=-TGA``).

    Raises:
      ValueError: naming the unknown format or the malformed list, and the flag.
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("--accepted_formats is empty; pass 'default', 'JPEG,PNG' or '+EPS,-TGA'")
    if items[0].lower() == "default":
        if len(items) == 1:
            return DEFAULT_ACCEPTED_FORMATS
        items = items[1:]
        if not all(item[0] in "+-" for item in items):
            raise ValueError(
                f"--accepted_formats {text!r}: after 'default' every item must be +NAME or -NAME"
            )
    known = pillow_formats()
    signed = [item[0] in "+-" for item in items]
    if any(signed) and not all(signed):
        raise ValueError(
            f"--accepted_formats {text!r} mixes signed (+X/-X) and plain names; use either a "
            "full list ('JPEG,PNG') or changes to the default ('default,+EPS,-TGA')"
        )

    def name_of(item: str) -> str:
        name = item.lstrip("+-").strip().upper()
        if name not in known:
            raise ValueError(
                f"--accepted_formats names unknown format {name!r}; Pillow here opens: "
                f"{', '.join(known)}"
            )
        return name

    if not any(signed):
        names = [name_of(item) for item in items]
        return tuple(dict.fromkeys(names))
    result = list(DEFAULT_ACCEPTED_FORMATS)
    for item in items:
        name = name_of(item)
        if item[0] == "-" and name in result:
            result.remove(name)
        elif item[0] == "+" and name not in result:
            # Added formats are tried before TGA, whose lack of a magic number makes it last.
            result.insert(result.index("TGA") if "TGA" in result else len(result), name)
    if not result:
        raise ValueError(f"--accepted_formats {text!r} leaves no format accepted")
    return tuple(result)


def why_not_accepted(name: str) -> str:
    """A short reason a recognised format is not accepted, for a rejection's detail."""
    if name in NOT_DECODABLE:
        return NOT_DECODABLE[name]
    if name in EXCLUDED_FORMATS:
        return f"not accepted by default: {EXCLUDED_FORMATS[name]}; --accepted_formats +{name}"
    return f"not in --accepted_formats; --accepted_formats +{name} accepts it"


def classify_error(error: BaseException, *, stage: str) -> str:
    """The reason code for an exception Pillow raised while opening or decoding a file.

    Args:
      error: what was raised.
      stage: ``"header"`` (while opening) or ``"pixels"`` (while decoding).

    Returns:
      ``decompression_bomb``, ``unsupported_feature``, ``truncated``, and otherwise
      ``corrupt_header`` for a header or ``decode_error`` for pixel data.
    """
    message = str(error)
    if isinstance(error, Image.DecompressionBombError):
        return "too_many_pixels"
    if _BOMB.search(message):
        return "decompression_bomb"
    if _UNSUPPORTED.search(message):
        return "unsupported_feature"
    if isinstance(error, (EOFError, struct.error)) or _TRUNCATED.search(message):
        return "truncated"
    if isinstance(error, OverflowError):
        return "corrupt_header"  # a header value beyond what the decoder takes
    return "corrupt_header" if stage == "header" else "decode_error"


def error_text(error: BaseException, fmt: str | None) -> str:
    """What a Pillow exception says about the file, in words a reader of ``rejected.jsonl``
    follows: some plugins fail on a lookup, whose message is the key alone (``b'  '``) or
    ``tuple.index(x): x not in tuple``.

    Args:
      error: what was raised.
      fmt: the file's format, when known.
    """
    message = str(error).strip()
    lookup = isinstance(error, KeyError) or (
        isinstance(error, ValueError) and message.endswith(("not in tuple", "not in list"))
    )
    if lookup:
        found = error.args[0] if isinstance(error, KeyError) and error.args else None
        if isinstance(found, bytes):
            found = found.decode("latin-1")  # XPM codes are text: '  ' rather than b'  '
        key = "" if found is None else f" {found!r}"
        if fmt == "XPM":
            return f"a pixel's code{key} is not in the file's colour table"
        return f"the file refers to a value{key} it does not define ({type(error).__name__})"
    if isinstance(error, OverflowError):
        return f"a header field is too large for Pillow's {fmt or 'image'} decoder ({message})"
    if isinstance(error, AssertionError) and not message:
        return f"a check in Pillow's {fmt or 'image'} plugin failed (a field it does not support)"
    return message or type(error).__name__
