"""The PyTorch loaders ``bench_torch_loaders`` measures our reader against: how each one's users
write the benchmark's images and read them back.

MosaicML Streaming 0.13.0 (``MDSWriter`` / ``StreamingDataset`` + its ``StreamingDataLoader``),
LitData 0.2.76 (``optimize`` / ``StreamingDataset`` + ``StreamingDataLoader``) and webdataset
1.0.2 (``ShardWriter`` / ``WebDataset`` + torch's ``DataLoader``), pinned in
``requirements-bench-torch.txt``. They run in a venv of their own (MosaicML Streaming needs
numpy<2.2, the project pins 2.4.6), so this module is imported only by the benchmark's
measuring processes in that venv, never by the project. Each peer is imported where it is used:
MosaicML Streaming's import (transformers) alone takes about 8 CPU-seconds.

Every peer stores each example as ``image`` (the already-encoded 256 px JPEG q90 bytes, or the
224x224x3 uint8 RAW centre crop as the peer's array type), ``label`` and ``id`` (the example's
index in the source list, which the resume check compares). Stored bytes, not the peers' image
columns: LitData 0.2.76's ``Jpeg(image=..., quality=90)`` stores PNG, and MosaicML's ``jpeg``
column re-encodes at quality 75 unless given a file. Reading: torchvision's ``decode_jpeg`` (the
fastest decoder PyTorch users have), ``RandomResizedCrop(224)`` and a horizontal flip for JPEG, a
flip alone for RAW (as our reader does), batches of 32 from a loader with two persistent
workers, uint8 CHW.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision.io import decode_jpeg
from torchvision.transforms import v2

__all__ = [
    "BATCH_SIZE",
    "IMAGE_SIZE",
    "PEERS",
    "RAW_SHAPE",
    "SHARDS",
    "WORKERS",
    "Augment",
    "PeerLoader",
    "open_peer",
    "write_peer",
]

IMAGE_SIZE = 224
RAW_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 3)
BATCH_SIZE = 32
WORKERS = 2
# Shards (chunks, tar files) per dataset: as many as our pipeline writes for the benchmark, so
# the two workers split every system's files alike.
SHARDS = 8
PEERS = ("mosaic", "litdata", "wds")

# The stored bytes are immutable; torch warns once per process that its tensor view of them
# must not be written to, which the decode never does.
warnings.filterwarnings("ignore", message="The given (buffer|NumPy array) is not writable")

# (sample id, label, payload): payload is the JPEG file's bytes, or RAW's 224*224*3 HWC bytes.
Example = tuple[int, int, bytes]


class Augment:
    """A stored image -> the training crop, uint8 CHW: decode, random resized 224 crop and flip
    for JPEG; a flip alone for RAW (already 224x224, as our RAW reader reads it)."""

    def __init__(self, fmt: str) -> None:
        if fmt not in ("jpeg", "raw"):
            raise ValueError(f"fmt must be 'jpeg' or 'raw', got {fmt!r}")
        self.fmt = fmt
        self.crop = v2.RandomResizedCrop(IMAGE_SIZE, antialias=False)
        self.flip = v2.RandomHorizontalFlip()

    def __call__(self, image: bytes | np.ndarray) -> torch.Tensor:
        if self.fmt == "raw":
            pixels = np.frombuffer(image, np.uint8) if isinstance(image, bytes) else image
            return self.flip(torch.from_numpy(pixels.reshape(RAW_SHAPE)).permute(2, 0, 1))
        return self.flip(self.crop(decode_jpeg(torch.frombuffer(image, dtype=torch.uint8))))


def _stored_image(fmt: str, payload: bytes) -> bytes | np.ndarray:
    """What a peer's users store: the JPEG bytes, or the RAW pixels as an HWC array."""
    return payload if fmt == "jpeg" else np.frombuffer(payload, np.uint8).reshape(RAW_SHAPE)


def _per_shard(examples: Sequence[Example]) -> int:
    return math.ceil(len(examples) / SHARDS)


def write_peer(system: str, fmt: str, examples: Sequence[Example], out: Path) -> None:
    """Writes ``examples`` at ``out`` (created) in ``system``'s format, as its users would.

    Raises:
      ValueError: for a system other than ``PEERS``.
    """
    if system == "mosaic":
        from streaming import MDSWriter

        column = "bytes" if fmt == "jpeg" else f"ndarray:uint8:{','.join(map(str, RAW_SHAPE))}"
        columns = {"image": column, "label": "int", "id": "int"}
        size = sum(len(p) for _, _, p in examples)
        # size_limit is per shard, in bytes: SHARDS shards, with room for the headers.
        limit = int(size / SHARDS * 1.02) + 4096
        with MDSWriter(out=str(out), columns=columns, size_limit=limit) as writer:
            for sample_id, label, payload in examples:
                image = _stored_image(fmt, payload)
                writer.write({"image": image, "label": label, "id": sample_id})
    elif system == "litdata":
        import litdata

        inputs = [(fmt, *example) for example in examples]
        litdata.optimize(
            fn=_litdata_sample,
            inputs=inputs,
            output_dir=str(out),
            chunk_size=_per_shard(examples),
            num_workers=WORKERS,
            verbose=False,
        )
    elif system == "wds":
        import webdataset as wds

        out.mkdir(parents=True)
        key = "jpg" if fmt == "jpeg" else "npy"
        pattern = str(out / "shard-%06d.tar")
        with wds.ShardWriter(pattern, maxcount=_per_shard(examples), verbose=0) as sink:
            for sample_id, label, payload in examples:
                image = _stored_image(fmt, payload)
                sink.write({"__key__": f"{sample_id:08d}", key: image, "cls": label})
    else:
        raise ValueError(f"system must be one of {PEERS}, got {system!r}")


def _litdata_sample(item: tuple[str, int, int, bytes]) -> dict[str, Any]:
    """LitData's ``optimize`` function (run in its worker processes): one stored sample."""
    fmt, sample_id, label, payload = item
    return {"image": _stored_image(fmt, payload), "label": label, "id": sample_id}


@functools.cache
def _mosaic_images() -> type:
    """MosaicML's dataset with the training transform applied per sample (``get_item``)."""
    from streaming import StreamingDataset

    class MosaicImages(StreamingDataset):
        def __init__(self, fmt: str, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.augment = Augment(fmt)

        def get_item(self, sample_id: int, retry: int = 7) -> Any:
            sample = super().get_item(sample_id, retry)
            return self.augment(sample["image"]), sample["label"], sample["id"]

    return MosaicImages


@functools.cache
def _lit_images() -> type:
    """LitData's dataset with the training transform applied per sample (``__getitem__``)."""
    import litdata

    class LitImages(litdata.StreamingDataset):
        def __init__(self, fmt: str, input_dir: str) -> None:
            # batch_decode=0 deserialises the one item asked for: LitData's default window
            # would decode RAW arrays the shuffle then drops.
            batch_decode = 0 if fmt == "raw" else "auto"
            super().__init__(input_dir, shuffle=True, seed=0, batch_decode=batch_decode)
            self.augment = Augment(fmt)

        def __getitem__(self, index: Any) -> Any:
            sample = super().__getitem__(index)
            return self.augment(sample["image"]), sample["label"], sample["id"]

    return LitImages


class _WdsSample:
    """A webdataset sample dict -> ``(image, label, id)``; the id is the sample's key."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.augment = Augment(fmt)

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int, int]:
        if self.fmt == "jpeg":
            image = self.augment(sample["jpg"])
        else:
            image = self.augment(np.load(io.BytesIO(sample["npy"])))
        return image, int(sample["cls"]), int(sample["__key__"])


@dataclasses.dataclass
class PeerLoader:
    """A peer's loader, iterating one epoch.

    Attributes:
      batches: the epoch's batches, each ``(images uint8 [B, 3, 224, 224], labels, ids)``.
      save: the loader's own mid-epoch checkpoint (a picklable state), or None when the system
        has no resume API (webdataset).
      loader: the DataLoader, kept alive for its persistent workers.
    """

    batches: Iterator[Any]
    save: Callable[[], Any] | None
    loader: Any


def open_peer(system: str, fmt: str, data: Path, state: Any | None = None) -> PeerLoader:
    """Builds ``system``'s loader over the dataset at ``data`` and starts its epoch, restored
    first from ``state`` (from ``PeerLoader.save``) when given.

    Raises:
      ValueError: for a system other than ``PEERS``, or a state for webdataset (no resume).
    """
    common = {"batch_size": BATCH_SIZE, "num_workers": WORKERS, "persistent_workers": True}
    if system == "mosaic":
        from streaming import StreamingDataLoader
        from streaming.base.util import clean_stale_shared_memory

        # A measuring process killed earlier leaves MosaicML's shared memory behind.
        clean_stale_shared_memory()
        dataset = _mosaic_images()(
            fmt, local=str(data), shuffle=True, shuffle_seed=0, batch_size=BATCH_SIZE
        )
        mosaic = StreamingDataLoader(dataset, **common)
        if state is not None:
            mosaic.load_state_dict(state)
        return PeerLoader(iter(mosaic), mosaic.state_dict, mosaic)
    if system == "litdata":
        import litdata

        lit = litdata.StreamingDataLoader(_lit_images()(fmt, str(data)), **common)
        if state is not None:
            lit.load_state_dict(state)
        return PeerLoader(iter(lit), lit.state_dict, lit)
    if system == "wds":
        import webdataset as wds

        if state is not None:
            raise ValueError("webdataset has no resume API; got a state to restore")
        urls = sorted(str(p) for p in data.glob("*.tar"))
        pipeline = wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)
        pipeline = pipeline.shuffle(1000).map(_WdsSample(fmt))
        loader = torch.utils.data.DataLoader(pipeline, **common)
        return PeerLoader(iter(loader), None, loader)
    raise ValueError(f"system must be one of {PEERS}, got {system!r}")
