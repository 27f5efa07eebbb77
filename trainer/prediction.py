"""Classifying image files with an exported SavedModel (``tfrecord-predict``).

The model is loaded with ``tf.saved_model.load`` and called through its ``serving_default``
signature, the function TensorFlow Serving calls, so a prediction here is what a server would
answer for the same bytes.

Files go to the signature as they are when TensorFlow's decoders read them as the pipeline's
decoder (Pillow) did: JPEG (grey or RGB) and PNG, without an EXIF orientation other than 1 and
without an ICC profile. Anything else (an EXIF-rotated photo, a profile to convert to sRGB, CMYK,
TIFF, GIF, WebP, every other format Pillow opens) is prepared on the host first, as the
pipeline prepares it: oriented, converted to sRGB, 16-bit samples shifted to 8, and sent as a
lossless PNG keeping any alpha, which the signature composites over the dataset's background.
A JPEG prepared here is decoded at the DCT scale the pipeline decoded it at (the stored side
comes from the export's ``assets/export.json``), so an upright photo reaches the model as its
copy in the dataset did. One difference remains: the pipeline applies an RGB image's ICC
profile after resizing it, on fewer pixels, and this before.

A file that cannot be read or decoded is reported on its own (``Failure``) and the others are
still classified: a batch that fails is retried one file at a time to find the bad one.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

__all__ = [
    "Classifier",
    "Failure",
    "Prediction",
    "UnreadableImage",
    "image_extensions",
    "list_images",
    "load_classifier",
    "predict_files",
    "serving_bytes",
]

# The file's bytes go to the signature unchanged in these formats and modes (TensorFlow's
# decoders read them as Pillow does); 16-bit PNG keeps its high byte in both (``shift``).
_AS_IS = {
    "JPEG": frozenset({"L", "RGB"}),
    "PNG": frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "I;16", "I;16B"}),
}
_ORIENTATION = 0x0112  # the EXIF tag
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "La", "RGBa"})


class UnreadableImage(ValueError):
    """A file that is not an image Pillow or TensorFlow can decode; the message says why."""


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One file's classes, most probable first, with their scores."""

    path: str
    classes: tuple[str, ...]
    scores: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Failure:
    """A file that could not be classified, and why."""

    path: str
    reason: str


def image_extensions() -> frozenset[str]:
    """The file name extensions (lower case, with the dot) of every format Pillow opens."""
    from PIL import Image

    Image.init()
    return frozenset(
        ext.lower() for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN
    )


def list_images(paths: Sequence[str]) -> list[str]:
    """The files to classify: each path given that is not a directory (whatever its name), and
    in each directory, recursively, the files whose extension is one of ``image_extensions``,
    in sorted order; hidden files and directories (``.*``) are skipped as the pipeline skips
    them."""
    extensions = image_extensions()
    found: list[str] = []
    for path in paths:
        if not os.path.isdir(path):
            found.append(path)
            continue
        inside = []
        for directory, subdirectories, files in os.walk(path):
            subdirectories[:] = sorted(d for d in subdirectories if not d.startswith("."))
            inside += [
                os.path.join(directory, name)
                for name in files
                if not name.startswith(".") and os.path.splitext(name)[1].lower() in extensions
            ]
        found += sorted(inside)
    return found


def _orientation(image: Any) -> int:
    try:
        return int(image.getexif().get(_ORIENTATION, 1) or 1)
    except Exception:  # Pillow raises many types for a malformed EXIF block
        return 1  # as the pipeline: a damaged EXIF block does not cost the image


def serving_bytes(data: bytes, *, stored_side: int | None = None) -> bytes:
    """The bytes to send to the signature for a file's ``data``: unchanged, or the image
    prepared on the host as a PNG (see the module's docstring).

    Args:
      data: the file.
      stored_side: the side the dataset stores (``export.json``): a JPEG prepared here is
        decoded at the DCT scale the pipeline decoded it at for that side (Pillow's ``draft``),
        as the graph does for the JPEGs it decodes itself, so the resize starts from the same
        pixels. None decodes at full size.

    Raises:
      UnreadableImage: if Pillow cannot open or decode the file.
    """
    from PIL import Image, ImageOps

    if not data:
        raise UnreadableImage("empty file")
    try:
        image = Image.open(io.BytesIO(data))
        orientation = _orientation(image)
        plain = image.format in _AS_IS and image.mode in _AS_IS[image.format]
        if plain and orientation == 1 and not image.info.get("icc_profile"):
            return data
        if stored_side is not None and image.format in ("JPEG", "MPO"):
            image.draft(None, (stored_side, stored_side))
        image.load()
        # Pillow's own EXIF rotation (the pipeline applies the same eight transposes); the
        # result keeps the image's info, its ICC profile among them.
        prepared = _srgb(ImageOps.exif_transpose(image))
    except Image.UnidentifiedImageError as e:
        raise UnreadableImage(f"not an image: no format Pillow reads starts {data[:20]!r}") from e
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise UnreadableImage(f"Pillow cannot decode it: {type(e).__name__}: {e}") from e
    buffer = io.BytesIO()
    prepared.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _srgb(image: Any) -> Any:
    """``image`` as 8-bit sRGB, ``RGB`` or (with transparency) ``RGBA``: through its ICC profile
    with the perceptual intent, as the pipeline converts; 16-bit samples shifted to 8."""
    import numpy as np
    from PIL import Image, ImageCms

    if image.mode in ("I;16", "I;16B", "I;16L"):
        image = Image.fromarray((np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8))
    alpha = image.mode in _ALPHA_MODES or (image.mode != "RGB" and "transparency" in image.info)
    mode = "RGBA" if alpha else "RGB"
    icc = image.info.get("icc_profile")
    if icc:
        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            base = image if image.mode in ("RGB", "RGBA", "CMYK", "L") else image.convert(mode)
            converted = ImageCms.profileToProfile(
                base,
                source,
                ImageCms.createProfile("sRGB"),
                renderingIntent=ImageCms.Intent.PERCEPTUAL,
                outputMode="RGBA" if base.mode == "RGBA" else "RGB",
            )
            if converted is not None:
                return converted
        except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
            pass  # an unusable profile: the pixels are taken as sRGB, as the pipeline does
    return image.convert(mode)


@dataclasses.dataclass(frozen=True)
class Classifier:
    """A loaded SavedModel's ``serving_default`` signature.

    Attributes:
      loaded: what ``tf.saved_model.load`` returned (it owns the signature's variables).
      signature: the function, ``image_bytes`` in, ``scores`` and ``classes`` out.
      num_classes: the width of ``scores``.
      stored_side: the side the training data stored its images at (``assets/export.json``),
        or None for shards the pipeline did not write or a SavedModel of another exporter.
    """

    loaded: Any
    signature: Any
    num_classes: int
    stored_side: int | None = None


def load_classifier(model_dir: str) -> Classifier:
    """Loads the SavedModel in ``model_dir`` for ``predict_files``.

    Raises:
      ValueError: naming the directory, if it holds no SavedModel whose ``serving_default``
        signature takes ``image_bytes`` and returns ``scores`` and ``classes``.
    """
    import tensorflow as tf

    if not tf.saved_model.contains_saved_model(model_dir):
        raise ValueError(f"{model_dir} holds no SavedModel: see tfrecord-export")
    loaded = tf.saved_model.load(model_dir)
    signature = loaded.signatures.get("serving_default")
    inputs = {} if signature is None else signature.structured_input_signature[1]
    outputs = {} if signature is None else signature.structured_outputs
    if "image_bytes" not in inputs or not {"scores", "classes"} <= set(outputs):
        raise ValueError(
            f"{model_dir}: its serving_default signature does not take image_bytes and return "
            f"scores and classes (it takes {sorted(inputs)}, returns {sorted(outputs)}): export "
            "it with tfrecord-export"
        )
    return Classifier(loaded, signature, int(outputs["scores"].shape[-1]), _stored_side(model_dir))


def _stored_side(model_dir: str) -> int | None:
    """The stored side ``tfrecord-export`` recorded in ``assets/export.json``, if any."""
    import json

    import tensorflow as tf

    path = os.path.join(model_dir, "assets", "export.json")
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        stored = (json.load(f).get("preprocessing") or {}).get("stored")
    side = stored.get("image_size") if isinstance(stored, dict) else None
    return side if isinstance(side, int) else None


def _classify(classifier: Classifier, batch: list[bytes]) -> tuple[Any, Any]:
    import tensorflow as tf

    outputs = classifier.signature(image_bytes=tf.constant(batch, dtype=tf.string))
    return outputs["scores"].numpy(), outputs["classes"].numpy()


def _ranked(path: str, scores: Any, classes: Any, top_k: int) -> Prediction:
    import numpy as np

    order = np.argsort(-scores, kind="stable")[:top_k]
    return Prediction(
        path,
        tuple(classes[i].decode("utf-8") for i in order),
        tuple(float(scores[i]) for i in order),
    )


def _read(path: str, stored_side: int | None) -> bytes:
    try:
        with open(path, "rb") as f:
            return serving_bytes(f.read(), stored_side=stored_side)
    except OSError as e:
        raise UnreadableImage(f"cannot read: {e.strerror or e}") from e


def _batch_results(
    classifier: Classifier, batch: list[tuple[str, bytes]], top_k: int
) -> list[Prediction | Failure]:
    """Classifies a batch; when TensorFlow cannot decode one of its files, each file alone."""
    import tensorflow as tf

    try:
        scores, classes = _classify(classifier, [data for _, data in batch])
    except tf.errors.InvalidArgumentError as e:
        if len(batch) == 1:
            reason = _decoder_message(str(e.message or ""))
            return [Failure(batch[0][0], f"TensorFlow cannot decode it: {reason}")]
        return [r for item in batch for r in _batch_results(classifier, [item], top_k)]
    return [_ranked(path, scores[i], classes[i], top_k) for i, (path, _) in enumerate(batch)]


def _decoder_message(message: str) -> str:
    """The decoder's own words in a graph execution error (``Invalid JPEG data or crop
    window.``), without the lines naming the graph's nodes."""
    lines = [
        line.strip()
        for line in message.splitlines()
        if line.strip()
        and not line.startswith(("\t", " ", "Graph execution error", "Detected at node", "<"))
    ]
    return lines[-1] if lines else "undecodable"


def predict_files(
    classifier: Classifier, paths: Iterable[str], *, batch_size: int = 32, top_k: int = 1
) -> Iterator[Prediction | Failure]:
    """Classifies ``paths`` in batches, yielding one result per path, in order.

    Args:
      classifier: ``load_classifier``'s.
      paths: image files.
      batch_size: files per call of the signature.
      top_k: classes kept per file, most probable first.
    """
    batch: list[tuple[str, bytes]] = []
    pending: list[Prediction | Failure | None] = []  # None: the batch's next result
    for path in paths:
        try:
            batch.append((path, _read(path, classifier.stored_side)))
            pending.append(None)
        except UnreadableImage as e:
            pending.append(Failure(path, str(e)))
        if len(batch) == batch_size:
            yield from _merge(pending, _batch_results(classifier, batch, top_k))
            batch, pending = [], []
    if batch or pending:
        yield from _merge(pending, _batch_results(classifier, batch, top_k) if batch else [])


def _merge(
    pending: list[Prediction | Failure | None], results: list[Prediction | Failure]
) -> Iterator[Prediction | Failure]:
    """The results in the order of the paths: failures where they were found, the batch's
    results in the places they left."""
    classified = iter(results)
    for item in pending:
        yield next(classified) if item is None else item
