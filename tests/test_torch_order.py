"""The torch loader's plan (``tfrecord_io.torch.order``): epochs, windows, steps and shares."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tfrecord_io.torch.order import EpochOrder, SplitLayout, iteration

COUNTS = (60, 6, 30, 12, 0, 48, 6, 12)


def _layout() -> SplitLayout:
    return SplitLayout.from_counts(COUNTS)


def test_an_epoch_is_a_permutation_mixed_within_windows() -> None:
    layout = _layout()
    order = EpochOrder(layout, seed=3, epoch=0, window_shards=2, shuffle=True)
    indices = order.indices(0, layout.num_examples)
    assert sorted(indices.tolist()) == list(range(layout.num_examples))
    # Pieces asked for separately are the same order.
    pieces = np.concatenate([order.indices(a, min(a + 7, 174)) for a in range(0, 174, 7)])
    assert (pieces == indices).all()
    # Each window's examples come from that window's shards only, and are mixed.
    shards, _ = layout.locate(indices)
    position = 0
    for _window in range(-(-layout.num_shards // 2)):
        members = order.shards_of_window_at(position)[:2]
        size = int(layout.counts[members].sum())
        assert set(shards[position : position + size].tolist()) <= set(members.tolist())
        position += size
    assert position == layout.num_examples
    assert not (indices == np.sort(indices)).all()


def test_epochs_and_seeds_give_other_orders_and_eval_reads_file_order() -> None:
    layout = _layout()
    n = layout.num_examples

    def order(seed: int, epoch: int) -> list[int]:
        return (
            EpochOrder(layout, seed=seed, epoch=epoch, window_shards=2, shuffle=True)
            .indices(0, n)
            .tolist()
        )

    assert order(3, 0) == order(3, 0)
    assert order(3, 0) != order(3, 1)
    assert order(3, 0) != order(4, 0)
    plain = EpochOrder(layout, seed=3, epoch=5, window_shards=2, shuffle=False)
    assert plain.indices(0, n).tolist() == list(range(n))


def test_locate_maps_indices_to_shard_and_record_across_empty_shards() -> None:
    layout = _layout()
    shards, records = layout.locate(np.arange(layout.num_examples))
    expected = [(s, r) for s, c in enumerate(COUNTS) for r in range(c)]
    assert list(zip(shards.tolist(), records.tolist(), strict=True)) == expected


@pytest.mark.parametrize("remainder", ["carry", "drop"])
@pytest.mark.parametrize("g,origin", [(12, 0), (12, 40), (7, 0), (24, 100), (174, 0)])
def test_passes_tile_the_stream(remainder: str, g: int, origin: int) -> None:
    """Consecutive passes cover the stream from the origin without a gap or an overlap (carry),
    or each epoch's largest multiple of the batch (drop)."""
    n = 174
    covered: list[int] = []
    for epoch in range(origin // n, origin // n + 4):
        plan = iteration(
            epoch=epoch, origin=origin, num_examples=n, global_batch=g, training=True,
            remainder=remainder,
        )  # fmt: skip
        steps = [(plan.step_start(k), plan.end_of(k)) for k in range(plan.first, plan.stop)]
        for start, _ in steps:
            assert epoch * n <= start < (epoch + 1) * n
        if remainder == "drop":
            assert all(end <= (epoch + 1) * n for _, end in steps)
        covered += [p for a, b in steps for p in range(a, b)]
    assert covered == sorted(set(covered))
    if remainder == "carry":
        assert covered == list(range(origin, covered[-1] + 1))


@pytest.mark.parametrize("world,workers", [(1, 1), (2, 2), (3, 1), (3, 4)])
def test_ranks_and_workers_share_each_step_once(world: int, workers: int) -> None:
    plan = iteration(epoch=0, origin=0, num_examples=174, global_batch=12, training=True)
    seen = []
    per_rank = []
    for rank in range(world):
        steps = sorted(
            itertools.chain.from_iterable(plan.worker_steps(w, workers) for w in range(workers))
        )
        per_rank.append(len(steps))
        for step in steps:
            start, stop = plan.rank_slice(step, rank, world)
            seen += range(start, stop)
    assert len(set(per_rank)) == 1
    assert sorted(seen) == list(range(plan.start_position, plan.end_of(plan.stop - 1)))


def test_evaluation_is_one_pass_with_a_short_last_step_split_over_ranks() -> None:
    plan = iteration(epoch=2, origin=0, num_examples=50, global_batch=12, training=False)
    assert (plan.first, plan.stop, plan.tail, plan.num_steps) == (0, 3, 14, 4)
    shares = [plan.rank_slice(3, rank, 3) for rank in range(3)]
    assert [b - a for a, b in shares] == [4, 5, 5]
    seen = [p for k in range(4) for r in range(3) for p in range(*plan.rank_slice(k, r, 3))]
    assert sorted(seen) == list(range(50))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="holds no example"):
        SplitLayout.from_counts([0, 0])
    with pytest.raises(ValueError, match="remainder"):
        iteration(epoch=0, origin=0, num_examples=5, global_batch=2, training=True, remainder="pad")
    order = EpochOrder(_layout(), seed=0, epoch=0, window_shards=2, shuffle=True)
    with pytest.raises(ValueError, match="outside"):
        order.indices(10, 500)
