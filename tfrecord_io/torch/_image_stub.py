"""Temporary stand-in for tfrecord_io.torch.image while it is written."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import torch
from PIL import Image


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    image_size: int
    training: bool
    encoding: str
    stored_size: int | None = None


def decode_into(encoded: bytes, out: np.ndarray, *, seed: int, spec: ImageSpec) -> None:
    if spec.encoding == "raw":
        s = spec.stored_size
        img = np.frombuffer(encoded, np.uint8).reshape(s, s, 3)
        im = Image.fromarray(img)
    else:
        im = Image.open(io.BytesIO(encoded)).convert("RGB")
    im = im.resize((spec.image_size, spec.image_size), Image.BILINEAR)
    arr = np.asarray(im)
    if spec.training and seed & 1:
        arr = arr[:, ::-1]
    out[...] = arr


def normalize_batch(images: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor([123.675, 116.28, 103.53])
    std = torch.tensor([58.395, 57.12, 57.375])
    return (images.float() - mean) / std
