"""Exact epochs: the delivered set (``tfrecord_io.delivery``) and the reader's ``exclude=``
(``tfrecord_io.epochs``) over 1-3 input pipelines. Through a real tf.data service they are
tested end to end by ``test_elastic_resume.py``."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.fixtures.shards import WrittenDataset, copy_dataset, write_dataset
from tfrecord_io.delivery import DeliveredSet, DeliveryTracker, decode_positions, split_digest
from tfrecord_io.epochs import plan_partial_epochs, service_message_cap, share_ranges
from tfrecord_io.read_config import ReadConfig
from tfrecord_io.reader import make_dataset

N = 60


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> WrittenDataset:
    """60 train examples in 5 shards of unequal size (tiny JPEGs)."""
    return write_dataset(
        tmp_path_factory.mktemp("delivery") / "ds",
        examples={"train": N},
        num_shards={"train": 5},
        image_size=16,
    )


def _digest(dataset: WrittenDataset) -> str:
    return split_digest((s.file, s.num_examples) for s in dataset.manifest.split("train").shards)


def _read(
    dataset: WrittenDataset,
    exclude: DeliveredSet,
    *,
    pipelines: int,
    steps: int,
    batch: int = 8,
    seed: int = 3,
    only: int | None = None,
    order: str = "buffer",
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per pipeline (or only pipeline ``only``), ``steps`` batches of (keys, positions), read
    with ``ReadConfig.epoch_order`` ``order``."""
    out = []
    for p in range(pipelines) if only is None else [only]:
        ds = make_dataset(
            dataset.root,
            global_batch_size=batch,
            input_context=tf.distribute.InputContext(pipelines, p, pipelines),
            image_size=8,
            seed=seed,
            read_config=ReadConfig(with_keys=True, exclude=exclude, epoch_order=order),
        )
        out.append([(b[2].numpy(), b[3].numpy()) for b in ds.take(steps)])
    return out


def _positions(batches: list[list[tuple[np.ndarray, np.ndarray]]]) -> np.ndarray:
    return np.concatenate([p for pipeline in batches for _, p in pipeline])


# --- the delivered set --------------------------------------------------------------------


def test_delivered_set_round_trips_with_its_meta():
    value = DeliveredSet.from_indices(13, [0, 5, 12], seed=4, epoch=2, split="abc")
    value = DeliveredSet(13, 2, 4, value.bits, (3 * 13 + 1, 4 * 13), "abc")
    again, meta = DeliveredSet.from_bytes(value.to_bytes({"segment": {"start": 7}}))
    assert again == value and meta == {"segment": {"start": 7}}
    assert value.count == 3 and value.remaining == 10 and value.digest() == again.digest()
    assert np.flatnonzero(value.mask).tolist() == [0, 5, 12]
    assert [(e, np.flatnonzero(m).tolist()) for e, m in value.partial_epochs()] == [
        (2, [0, 5, 12]),
        (3, [1]),
        (4, [0]),
    ]
    # 1 bit per example plus a small header.
    assert len(DeliveredSet.empty(80_000).to_bytes()) < 80_000 // 8 + 200


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_examples": 0}, "num_examples must be an int >= 1"),
        ({"num_examples": 8, "epoch": -1}, "epoch must be an int >= 0"),
        ({"num_examples": 8, "bits": b"\x00\x00"}, "bits must be 1 bytes"),
        ({"num_examples": 6, "bits": b"\xff"}, "beyond num_examples=6"),
        ({"num_examples": 8, "later": (3,)}, "later must hold distinct positions"),
        ({"num_examples": 8, "split": 5}, "split must be"),
    ],
)
def test_delivered_set_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DeliveredSet(**kwargs)


def test_delivered_set_rejects_foreign_bytes_and_indices():
    with pytest.raises(ValueError, match="bad magic"):
        DeliveredSet.from_bytes(b"something else")
    with pytest.raises(ValueError, match=r"indices must be in \[0, 4\)"):
        DeliveredSet.from_indices(4, [4])
    with pytest.raises(TypeError, match="DeliveredSet"):
        DeliveryTracker("not a set")  # type: ignore[arg-type]


def test_tracker_rolls_epochs_and_reports_duplicates(caplog):
    tracker = DeliveryTracker(DeliveredSet.empty(4))
    assert tracker.add([0, 1]).added == 2
    # The last two of epoch 0 and the first of epoch 1 in one batch; one duplicate.
    result = tracker.add([2, 3, 4 + 2, 1])
    assert (result.added, result.duplicates, result.completed) == (3, 1, ((0, 0),))
    assert (tracker.epoch, tracker.count) == (1, 1)
    assert tracker.add([4 + 0]).stale == 0 and tracker.add([3]).stale == 1
    # Epoch 3 arriving while epoch 1 misses examples closes epoch 1, naming what it lost.
    result = tracker.add([3 * 4 + 0])
    assert result.completed == ((1, 2),) and tracker.epoch == 2
    assert "epoch 1 closed with 2 of its 4 examples never delivered" in caplog.text
    assert tracker.delivered.later == (12,)
    epochs, indices = decode_positions([13, 2], 4)
    assert epochs.tolist() == [3, 0] and indices.tolist() == [1, 2]
    with pytest.raises(ValueError, match="positions must be >= 0"):
        tracker.add([-1])


def test_tracker_is_saved_in_the_same_checkpoint_as_variables(tmp_path):
    step = tf.Variable(5, dtype=tf.int64)
    tracker = DeliveryTracker(DeliveredSet.empty(10, seed=1), meta={"note": "x"})
    tracker.add([1, 2, 3, 10 + 4])
    path = tf.train.Checkpoint(step=step, delivered=tracker).save(str(tmp_path / "ckpt"))
    step.assign(0)
    fresh = DeliveryTracker(DeliveredSet.empty(10))
    tf.train.Checkpoint(step=step, delivered=fresh).restore(path).assert_consumed()
    assert int(step.numpy()) == 5 and fresh.delivered == tracker.delivered
    assert fresh.meta == {"note": "x"} and fresh.count == 3


def test_partial_epochs_split_evenly_and_rotate():
    counts = [7, 0, 13, 5]
    delivered = DeliveredSet.from_indices(25, range(0, 25, 4))  # 7 delivered, 18 left
    shares = [
        plan_partial_epochs(delivered, counts, seed=1, num_pipelines=4, pipeline_id=p)
        for p in range(4)
    ]
    sizes = [share[0][0].examples for share in shares]
    assert sorted(sizes) == [4, 4, 5, 5] and sizes[:2] == [5, 5]  # the 2 extra go first
    assert all(offset == 2 for _, offset in shares)  # the next epoch's extras start at 2
    # A shard that cannot be read is not planned, and the rest still split evenly.
    missing = plan_partial_epochs(
        delivered, counts, seed=1, num_pipelines=1, pipeline_id=0, present=[1, 1, 0, 1]
    )[0][0]
    assert 2 not in missing.shards.tolist() and missing.examples == 18 - 10


@pytest.mark.parametrize("pipelines", [1, 3])
def test_only_records_before_the_last_delivered_one_go_through_the_lookup(pipelines):
    counts = np.array([40, 30, 50])
    bases = np.cumsum(counts) - counts
    # As an interruption leaves it: shard 0 read, shard 1 read up to record 19, both with the
    # holes a shuffle buffer held; shard 2 not begun.
    delivered_local = [set(range(40)) - {5, 17}, set(range(20)) - {3, 11, 12}, set()]
    indices = [int(b) + i for b, shard in zip(bases, delivered_local, strict=True) for i in shard]
    delivered = DeliveredSet.from_indices(int(counts.sum()), indices)
    mask = delivered.mask
    read: list[int] = []
    for p in range(pipelines):
        share = plan_partial_epochs(
            delivered, counts, seed=2, num_pipelines=pipelines, pipeline_id=p
        )[0][0]
        for shard, start, cut, stop in zip(
            share.shards, *share_ranges(share, bases, counts), strict=True
        ):
            assert start <= cut <= stop
            base = int(bases[shard])
            # Nothing delivered from cut on: that part is read without a lookup.
            assert not mask[base + cut : base + stop].any()
            # The looked-up part ends at the last delivered record, never later.
            assert cut == start or mask[base + cut - 1]
            looked_up = [i for i in range(start, cut) if not mask[base + i]]
            read += [base + i for i in [*looked_up, *range(cut, stop)]]
            assert cut - start <= {0: 40, 1: 20, 2: 0}[int(shard)]
    assert sorted(read) == np.flatnonzero(~mask).tolist()  # all that is left, once


def test_service_messages_of_exact_epochs_hold_at_most_a_64th_of_an_epoch():
    # A small split's messages are single batches (the 128-example default would let a worker
    # hold much of its epoch in flight); ImageNet's keep the default.
    cases = [(320, 8, 8), (60, 4, 4), (100_000, 32, 1_562), (1_281_167, 32, 20_018)]
    for examples, batch, cap in cases:
        assert service_message_cap(examples, batch) == cap


# --- the reader ---------------------------------------------------------------------------


ORDERS = pytest.mark.parametrize("order", ["buffer", "permutation"])


@ORDERS
@pytest.mark.parametrize("pipelines", [1, 3])
def test_every_example_once_per_epoch_over_any_number_of_pipelines(dataset, pipelines, order):
    batch = 6 if pipelines == 3 else 8
    steps = 2 * N // batch + 2  # two epochs and a bit
    empty = DeliveredSet.empty(N, seed=3)
    batches = _read(dataset, empty, pipelines=pipelines, steps=steps, batch=batch, order=order)
    epochs, indices = decode_positions(_positions(batches), N)
    for epoch in (0, 1):
        assert sorted(indices[epochs == epoch].tolist()) == list(range(N)), epoch
    assert set(epochs.tolist()) == {0, 1, 2}
    # The positions name the examples the batches hold.
    keys = dataset.keys("train")
    for pipeline in batches:
        for batch_keys, positions in pipeline:
            assert [k.decode() for k in batch_keys] == [keys[i] for i in positions % N]
    # Balanced: pipelines are never more than one example of an epoch apart.
    ends = [int(np.sum(np.concatenate([p for _, p in pipeline]) // N == 0)) for pipeline in batches]
    assert max(ends) - min(ends) <= 1


@pytest.mark.parametrize(
    "order", ["permutation", pytest.param("buffer", marks=pytest.mark.slow)]
)  # the slower order in the whole suite only
def test_exclude_reads_the_rest_of_the_epoch_then_full_epochs(dataset, order):
    digest = _digest(dataset)
    empty = DeliveredSet.empty(N, seed=3, split=digest)
    first = _read(dataset, empty, pipelines=2, steps=5, order=order)
    done = _positions(first) % N  # 40 of epoch 0, on 2 pipelines
    delivered = DeliveredSet.from_indices(N, done, seed=3, split=digest)
    rest = _read(dataset, delivered, pipelines=3, steps=14, batch=6, order=order)
    epochs, indices = decode_positions(_positions(rest), N)
    assert sorted(indices[epochs == 0].tolist()) == sorted(set(range(N)) - set(done.tolist()))
    assert sorted(indices[epochs == 1].tolist()) == list(range(N))
    # The same history and seed give the same order; another seed another one.
    again = _read(dataset, delivered, pipelines=3, steps=4, batch=6, only=0, order=order)
    assert np.array_equal(_positions(again), _positions([rest[0][:4]]))
    other = _read(dataset, delivered, pipelines=3, steps=4, batch=6, seed=4, only=0, order=order)
    assert not np.array_equal(_positions(other), _positions(again))


@ORDERS
def test_a_global_seed_changes_neither_building_nor_order(dataset, order):
    digest = _digest(dataset)
    delivered = DeliveredSet.empty(N, seed=3, split=digest)
    plain = _read(dataset, delivered, pipelines=1, steps=9, order=order)
    for global_seed in (0, 42):  # 0 once failed to build (a seed tensor compared as a bool)
        tf.random.set_seed(global_seed)
        try:
            seeded = _read(dataset, delivered, pipelines=1, steps=9, order=order)
        finally:
            tf.random.set_seed(None)
        assert np.array_equal(_positions(seeded), _positions(plain)), global_seed


@ORDERS
def test_a_begun_next_epoch_is_filtered_too(dataset, order):
    tracker = DeliveryTracker(DeliveredSet.empty(N, seed=3))
    tracker.add(np.arange(N - 5))  # epoch 0 but 5
    tracker.add(N + np.arange(3))  # 3 of epoch 1 already
    rest = _read(dataset, tracker.delivered, pipelines=1, steps=8, batch=8, order=order)
    for batch_positions in (p for _, p in rest[0]):
        tracker.add(batch_positions)
    epochs, indices = decode_positions(_positions(rest), N)
    assert sorted(indices[epochs == 0].tolist()) == list(range(N - 5, N))
    assert sorted(indices[epochs == 1].tolist()) == list(range(3, N))
    assert tracker.epoch == 2 and tracker.count == 64 - 62


@ORDERS
def test_exact_epoch_iterators_restore_exactly_without_py_function(dataset, tmp_path, order):
    delivered = DeliveredSet.from_indices(N, range(0, N, 3), seed=3)

    def build() -> tf.data.Dataset:
        return make_dataset(
            dataset.root,
            global_batch_size=8,
            input_context=tf.distribute.InputContext(2, 1, 2),
            image_size=8,
            seed=3,
            read_config=ReadConfig(exclude=delivered, epoch_order=order),
        )

    graph = build()._as_serialized_graph().numpy()
    assert b"PyFunc" not in graph and b"EagerPyFunc" not in graph
    iterator = iter(build())
    for _ in range(3):
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    expected = [next(iterator) for _ in range(6)]  # across the epoch boundary
    restored = iter(build())
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    for want, got in zip(expected, (next(restored) for _ in range(6)), strict=True):
        np.testing.assert_array_equal(want[0].numpy(), got[0].numpy())  # augmentation too
        np.testing.assert_array_equal(want[2].numpy(), got[2].numpy())
    assert set((np.concatenate([e[2].numpy() for e in expected]) // N).tolist()) == {0, 1}


def test_exclude_is_checked_against_the_split(dataset, foreign_shards, tmp_path):
    with pytest.raises(ValueError, match="exclude covers 59 examples, but split 'train'"):
        make_dataset(
            dataset.root,
            global_batch_size=4,
            read_config=ReadConfig(exclude=DeliveredSet.empty(59)),
        )
    with pytest.raises(ValueError, match="taken on another layout of split 'train'"):
        make_dataset(
            dataset.root,
            global_batch_size=4,
            read_config=ReadConfig(exclude=DeliveredSet.empty(N, split="0" * 32)),
        )
    with pytest.raises(ValueError, match="exclude= needs a dataset with dataset.json"):
        make_dataset(
            foreign_shards.glob,
            global_batch_size=4,
            read_config=ReadConfig(exclude=DeliveredSet.empty(12)),
        )
    with pytest.raises(ValueError, match="num_epochs=1 is already reached"):
        make_dataset(
            dataset.root,
            global_batch_size=4,
            read_config=ReadConfig(exclude=DeliveredSet.empty(N, epoch=1), num_epochs=1),
        )
    with pytest.raises(ValueError, match="without a record cache"):
        ReadConfig(exclude=DeliveredSet.empty(N), cache="memory")
    with pytest.raises(ValueError, match="exclude must be a tfrecord_io.DeliveredSet"):
        ReadConfig(exclude={1, 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reads training epochs"):
        make_dataset(
            dataset.root,
            global_batch_size=4,
            training=False,
            read_config=ReadConfig(exclude=DeliveredSet.empty(N)),
        )


def _flip(path: Path, record: int, *, at: int, mask: int) -> None:
    """Flips bits ``mask`` of the byte at offset ``at`` within record ``record`` of a TFRecord
    file (0: its length, whose header CRC then fails; 12: its data, whose CRC then fails)."""
    data = bytearray(path.read_bytes())
    offset = 0
    for _ in range(record):
        (length,) = struct.unpack_from("<Q", data, offset)
        offset += 12 + length + 4
    data[offset + at] ^= mask
    path.write_bytes(bytes(data))


def _damage_record(path: Path, record: int) -> None:
    """Flips a byte in the data of record ``record`` (its CRC then fails)."""
    _flip(path, record, at=12, mask=0xFF)


def _damage_header(path: Path, record: int) -> None:
    """Flips a bit in the length of record ``record`` (its header CRC then fails)."""
    _flip(path, record, at=0, mask=0x01)


def test_damage_among_the_records_skipped_in_the_file_reader_still_fails(dataset, tmp_path):
    copy = copy_dataset(dataset, tmp_path / "ds")
    shards = copy.manifest.split("train").shards
    damaged = 2
    base = sum(s.num_examples for s in shards[:damaged])
    head = shards[damaged].num_examples // 2
    # The first half of the shard was delivered, so its reading starts after it; the damage is
    # in the header of a record in that half, which the file reader skips over.
    _damage_header(copy.shard_paths("train")[damaged], head // 2)
    delivered = DeliveredSet.from_indices(N, range(base, base + head), seed=3)

    def read(skip_corrupt: bool) -> np.ndarray:
        ds = make_dataset(
            copy.root,
            global_batch_size=4,
            image_size=8,
            seed=3,
            read_config=ReadConfig(exclude=delivered, skip_corrupt=skip_corrupt),
        )
        return np.concatenate([b[2].numpy() for b in ds.take(N // 4)])

    path = copy.shard_paths("train")[damaged]
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{path} ended before"):
        read(skip_corrupt=False)
    # Skipping damage, the rest of the epoch is every other shard's examples, once each.
    epochs, indices = decode_positions(read(skip_corrupt=True), N)
    rest = indices[epochs == 0].tolist()
    shard = set(range(base, base + shards[damaged].num_examples))
    assert sorted(rest) == sorted(set(range(N)) - shard)


@pytest.mark.parametrize("pipelines", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_shard_read_short_under_the_filter_still_fails(dataset, tmp_path, pipelines):
    copy = copy_dataset(dataset, tmp_path / "ds")
    shards = copy.manifest.split("train").shards
    damaged = 2
    base = sum(s.num_examples for s in shards[:damaged])
    short = shards[damaged].num_examples // 2  # records of the shard read before the damage
    _damage_record(copy.shard_paths("train")[damaged], short)
    # Delivered: the damaged record itself (where the marker would come) and the one before,
    # so the shard goes through the filter and the marker's own slot is filtered out.
    delivered = DeliveredSet.from_indices(N, [base + short - 1, base + short], seed=3)

    def read(skip_corrupt: bool) -> list[np.ndarray]:
        out = []
        for p in range(pipelines):
            ds = make_dataset(
                copy.root,
                global_batch_size=4,
                input_context=tf.distribute.InputContext(pipelines, p, pipelines),
                image_size=8,
                seed=3,
                read_config=ReadConfig(exclude=delivered, skip_corrupt=skip_corrupt),
            )
            out.extend(b[2].numpy() for b in ds.take(N // 4 + 1))  # past epoch 0's end
        return out

    path = copy.shard_paths("train")[damaged]
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{path} ended before"):
        read(skip_corrupt=False)
    # Skipping damage, the epoch's rest comes without the lost records, and nothing twice.
    got = np.concatenate(read(skip_corrupt=True))
    epochs, indices = decode_positions(got, N)
    lost = set(range(base + short, base + shards[damaged].num_examples))
    assert len(set(got.tolist())) == len(got)
    assert set(indices[epochs == 0].tolist()) <= set(range(N)) - lost - {base + short - 1}
    assert len(indices[epochs == 0]) > 0
