"""``tfrecord_io.torch.dataset`` in one process (with DataLoader workers): batches, epochs,
state and resume, options, damaged shards, and that TensorFlow is never imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.split_datasets import SplitDataset, write_split_dataset

torch = pytest.importorskip("torch")
tt = pytest.importorskip("tfrecord_io.torch")
from torch.utils.data import DataLoader  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
COUNTS = (20, 2, 10, 4, 16, 2)  # 54 examples, tenfold uneven


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> SplitDataset:
    return write_split_dataset(
        tmp_path_factory.mktemp("torch_loader") / "ds",
        COUNTS,
        image_size=16,
        validation_counts=(7, 6),
    )


def _indices(batches) -> list[int]:
    return [i for batch in batches for i in batch[-1].tolist()]


def _dataset(split: SplitDataset, **options):
    options.setdefault("global_batch_size", 8)
    options.setdefault("seed", 1)
    options.setdefault("window_shards", 2)
    return tt.dataset(split.root, "train", with_index=True, **options)


def test_batches_have_the_layouts_and_types_asked_for(split: SplitDataset) -> None:
    images, labels, indices = next(iter(_dataset(split)))
    assert images.shape == (8, 3, 16, 16) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.dtype == torch.int64 and (labels == indices % split.num_classes).all()
    hwc = next(iter(_dataset(split, layout="HWC", output="float32")))[0]
    assert hwc.shape == (8, 16, 16, 3) and hwc.dtype == torch.float32
    assert -3 < float(hwc.mean()) < 3
    ds = tt.dataset(split.root, "train", global_batch_size=4, with_keys=True, seed=0)
    _, _, keys = next(iter(ds))
    assert set(keys) <= set(split.keys["train"]) and len(keys) == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_each_pass_is_an_epoch_and_passes_advance(split: SplitDataset, workers: int) -> None:
    ds = _dataset(split)
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    n = sum(COUNTS)
    assert len(loader) == len(ds) == 7  # steps starting in [0, 54): 0, 8, ..., 48
    first = _indices(loader)
    second = _indices(loader)
    stream = first + second
    assert sorted(stream[:n]) == list(range(n))
    assert stream[:n] != sorted(stream[:n])
    assert len(first) == 56 and stream[n : 2 * n] != stream[:n]
    assert sorted(stream[n : 2 * n]) == list(range(n))


def test_set_epoch_reaches_persistent_workers(split: SplitDataset) -> None:
    ds = _dataset(split)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    epoch0 = _indices(loader)
    ds.set_epoch(0)
    assert _indices(loader) == epoch0
    ds.set_epoch(3)
    again = _dataset(split)
    again.set_epoch(3)
    assert _indices(loader) == _indices(DataLoader(again, batch_size=None))


def test_drop_remainder_skips_what_does_not_fill_a_step(split: SplitDataset) -> None:
    ds = _dataset(split, remainder="drop")
    first, second = _indices(ds), _indices(ds)
    assert len(first) == len(second) == 48
    assert len(set(first)) == 48 and set(first) != set(second)


def test_evaluation_reads_every_example_once_over_ranks(split: SplitDataset) -> None:
    seen, counts = [], []
    for rank in range(3):
        ds = tt.dataset(
            split.root, "validation", global_batch_size=6, training=False, rank=rank,
            world_size=3, with_index=True,
        )  # fmt: skip
        batches = list(DataLoader(ds, batch_size=None, num_workers=2))
        counts.append(len(batches))
        assert len(batches) == len(ds)
        seen += _indices(batches)
    assert sorted(seen) == list(range(13))
    assert counts == [2, 2, 2]  # 13 = a step of 6, then one of 7 split 2, 2, 3


def test_augmentation_depends_on_the_example_not_the_reader(split: SplitDataset) -> None:
    """An example is cropped and flipped the same in an epoch on one rank or on two."""
    one = [
        (i, image)
        for images, _, idx in _dataset(split, image_size=12)
        for i, image in zip(idx.tolist(), images, strict=True)
    ]
    parts = [list(_dataset(split, image_size=12, rank=r, world_size=2)) for r in range(2)]
    two = [
        (i, image)
        for steps in zip(*parts, strict=True)
        for images, _, idx in steps
        for i, image in zip(idx.tolist(), images, strict=True)
    ]
    assert [i for i, _ in one] == [i for i, _ in two]
    for (_, a), (_, b) in zip(one, two, strict=True):
        assert torch.equal(a, b)


def test_stateful_dataloader_resumes_exactly_on_the_same_workers(split: SplitDataset) -> None:
    loader = StatefulDataLoader(_dataset(split), batch_size=None, num_workers=2)
    it = iter(loader)
    before = _indices([next(it) for _ in range(3)])
    state = loader.state_dict()
    rest = _indices(it)
    resumed = StatefulDataLoader(_dataset(split), batch_size=None, num_workers=2)
    resumed.load_state_dict(state)
    after = _indices(resumed)
    assert after == rest
    assert sorted((before + after)[:54]) == list(range(54))


@pytest.mark.parametrize("workers,world,new_workers", [(2, 3, 1), (3, 1, 2), (0, 2, 3)])
def test_any_saved_state_resumes_on_another_topology(
    split: SplitDataset, workers: int, world: int, new_workers: int
) -> None:
    loader = StatefulDataLoader(_dataset(split), batch_size=None, num_workers=workers)
    it = iter(loader)
    before = _indices([next(it) for _ in range(4)])
    state = loader.state_dict()
    size = len(json.dumps(state, default=str))
    assert size < 4096, f"the loader's state is {size} bytes"
    after = []
    for rank in range(world):
        ds = _dataset(split, global_batch_size=6, rank=rank, world_size=world)
        ds.load_state_dict(state)
        after.append(
            [b[-1].tolist() for b in DataLoader(ds, batch_size=None, num_workers=new_workers)]
        )
    assert len({len(a) for a in after}) == 1, "ranks took different numbers of steps"
    stream = before + [i for step in zip(*after, strict=True) for part in step for i in part]
    assert sorted(stream[:54]) == list(range(54))


def test_a_pass_saved_at_its_end_resumes_at_the_next_epoch(split: SplitDataset) -> None:
    loader = StatefulDataLoader(_dataset(split), batch_size=None, num_workers=2)
    first = _indices(loader)
    state = loader.state_dict()
    ds = _dataset(split, global_batch_size=4)
    ds.load_state_dict(state)
    assert ds.epoch == 1
    second = _indices(DataLoader(ds, batch_size=None))
    stream = first + second
    assert sorted(stream[54:108]) == list(range(54))


def test_a_state_of_another_order_is_refused(split: SplitDataset) -> None:
    state = _dataset(split).state_dict()
    with pytest.raises(ValueError, match="seed=1.*seed=2"):
        _dataset(split, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="window_shards"):
        _dataset(split, window_shards=3).load_state_dict(state)
    with pytest.raises(ValueError, match="no tfrecord_io.torch dataset state"):
        _dataset(split).load_state_dict({"model": 1})


def test_options_are_checked_before_reading(split: SplitDataset) -> None:
    with pytest.raises(TypeError, match="'globl_batch_size'.*did you mean 'global_batch_size'"):
        tt.dataset(split.root, "train", globl_batch_size=8)
    with pytest.raises(ValueError, match="layout must be one of"):
        tt.dataset(split.root, "train", global_batch_size=8, layout="NCHW")
    with pytest.raises(ValueError, match="does not divide over 3 ranks"):
        tt.dataset(split.root, "train", global_batch_size=8, rank=0, world_size=3)
    with pytest.raises(ValueError, match="larger than split"):
        tt.dataset(split.root, "train", global_batch_size=64)
    with pytest.raises(KeyError):
        tt.dataset(split.root, "test", global_batch_size=8)
    with pytest.raises(FileNotFoundError, match="has no dataset.json"):
        tt.dataset(split.root / "nowhere", "train", global_batch_size=8)


def _damaged(split: SplitDataset, tmp_path: Path) -> Path:
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(split.root, root)
    return root


def test_damaged_shards_fail_naming_the_shard(split: SplitDataset, tmp_path: Path) -> None:
    root = _damaged(split, tmp_path)
    shard = root / "train-00000-of-00006.tfrecord"
    index = root / "train-00000-of-00006.idx"
    good_index = index.read_bytes()
    index.write_bytes(good_index.replace(b" ", b"x", 1))
    with pytest.raises(ValueError, match=rf"index file .*{index.name}: line 1"):
        list(tt.dataset(root, "train", global_batch_size=54, training=False))
    index.write_bytes(good_index)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    ds = tt.dataset(root, "train", global_batch_size=54, training=False)
    with pytest.raises(ValueError, match=rf"{shard.name}: record \d+ at byte \d+.*CRC"):
        list(ds)
    shard.write_bytes(bytes(data[:-10]))
    with pytest.raises(ValueError, match=rf"{shard.name} holds \d+ bytes, but dataset.json"):
        list(tt.dataset(root, "train", global_batch_size=54, training=False))
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        list(tt.dataset(root, "train", global_batch_size=54, training=False))


def test_labels_outside_the_classes_name_label_offset(split: SplitDataset) -> None:
    ds = tt.dataset(split.root, "train", global_batch_size=54, training=False, label_offset=1)
    with pytest.raises(ValueError, match="label 0, outside.*label_offset=1"):
        list(ds)


def test_shared_memory_batches_use_torch_new_shared() -> None:
    """The workers' batches are allocated in shared memory with ``UntypedStorage._new_shared``
    (what torch's own ``default_collate`` uses), so they reach the trainer without a copy; if
    torch renames it, this fails and ``dataset._batch_buffer`` needs the new name."""
    storage = torch.UntypedStorage._new_shared(16)
    assert storage.is_shared() and storage.nbytes() == 16
    assert isinstance(np.zeros(1), np.ndarray)


@pytest.mark.slow
def test_a_torchvision_model_trains_without_tensorflow(split: SplitDataset) -> None:
    """ResNet-18 takes a few SGD steps on batches from a DataLoader with two workers, in a
    process where TensorFlow cannot be imported (as on an install without it), and nothing of
    TensorFlow, Keras or TensorBoard was loaded. (A process of its own also because torch and
    TensorFlow's native libraries are not meant to share one, as in the suite's workers.)"""
    code = (
        "import sys\n"
        "sys.modules['tensorflow'] = None\n"
        "import json, torch, torchvision\n"
        "from torch.utils.data import DataLoader\n"
        "import tfrecord_io.torch as tt\n"
        "torch.manual_seed(0)\n"
        f"ds = tt.dataset({str(split.root)!r}, 'train', global_batch_size=8, seed=0, "
        "output='float32')\n"
        "model = torchvision.models.resnet18(num_classes=ds.num_classes)\n"
        "before = [p.detach().clone() for p in model.parameters()]\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        "losses = []\n"
        "for images, labels in DataLoader(ds, batch_size=None, num_workers=2):\n"
        "    loss = torch.nn.functional.cross_entropy(model(images), labels)\n"
        "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "    losses.append(float(loss))\n"
        "changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))\n"
        "loaded = sorted(m for m, v in sys.modules.items() if v is not None)\n"
        "print(json.dumps([losses, changed, len(ds), loaded]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses, changed, steps, loaded = json.loads(done.stdout.splitlines()[-1])
    assert len(losses) == steps == 7
    assert all(np.isfinite(losses)) and changed
    assert "tfrecord_io.torch.dataset" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "tensorboard")]


@pytest.fixture(params=["s3", "gcs"])
def bucket(request: pytest.FixtureRequest):
    """A fresh bucket on each real server in turn (moto's S3 API, the GCS emulator)."""
    return request.getfixturevalue("s3_env" if request.param == "s3" else "gcs_env")


@pytest.mark.slow
def test_a_bucket_reads_as_its_local_copy(split: SplitDataset, bucket, tmp_path: Path) -> None:
    """The same batches from ``s3://`` or ``gs://`` through the shard cache (this process owns
    it; the two DataLoader workers read through it) as from local disk, and one download per
    shard."""
    from tests.fixtures.object_store import upload_tree
    from tfrecord_io.cache import CacheConfig

    upload_tree(split.root, bucket.uri("ds"))
    cache = CacheConfig(cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 26)
    remote = tt.dataset(
        bucket.uri("ds"), "train", global_batch_size=8, seed=4, with_index=True,
        window_shards=2, shard_cache=cache,
    )  # fmt: skip
    local = _dataset(split, seed=4)
    got = list(DataLoader(remote, batch_size=None, num_workers=2))
    want = list(DataLoader(local, batch_size=None, num_workers=2))
    assert len(got) == len(want) == 7
    for (a, la, ia), (b, lb, ib) in zip(got, want, strict=True):
        assert torch.equal(ia, ib) and torch.equal(la, lb) and torch.equal(a, b)
    from tfrecord_io.torch.factory import _OWNED_CACHES

    owner = _OWNED_CACHES[str(tmp_path / "cache")]
    assert owner.stats.downloads == len(COUNTS), owner.stats
