"""Which kind of resume a run makes, decided from its latest checkpoint.

With the project's reader, a checkpoint holds, beside model, optimiser and step, the delivered
set (``tfrecord_io.DeliveryTracker``: the examples of the current epoch already trained on,
gathered from every worker's batches) and the *segment* that wrote it: the stretch of steps
run with one input layout (workers, batch, seed, data, tf.data service or not), the step it
started at, and the delivered set its pipelines were built from (its *origin*, kept in
``checkpoints/input/origin-<digest>.bin``).

* **fresh**: no checkpoint. A new segment from the empty set at epoch 0.
* **exact**: same layout, in-process, and every worker's iterator checkpoint at that step is
  there. The pipelines are rebuilt from the segment's origin and the iterators restored: the
  same order, augmentation included, as an uninterrupted run.
* **elastic**: anything else (other worker count, batch or seed; to, from or through the
  tf.data service; a missing iterator checkpoint). A new segment starts at the checkpoint's
  step from its delivered set: every pipeline reads the rest of the epoch, split evenly among
  the new pipelines, filtered in the graph.
* **restart**: the checkpoint has no delivered set, or it was taken on another layout of the
  split (the dataset changed): the model resumes and the epoch starts afresh.

Every worker reads the same checkpoint and the same iterator checkpoint files (written by
the previous run only) and so takes the same decision without talking to the others. Only
the chief writes the origin file of a new segment, before the first checkpoint that names it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfrecord_io.delivery import DeliveredSet, DeliveryTracker
    from trainer.strategy import Distribution

__all__ = ["KINDS", "ResumePlan", "agree_on_nonce", "describe_layout_change", "plan_resume"]

_log = logging.getLogger(__name__)

KINDS = ("fresh", "exact", "elastic", "restart")
_DELIVERED_KEY = "delivered"


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """The decision, and what the input pipelines are built from.

    Attributes:
      kind: one of ``KINDS``.
      step: the checkpoint's step (0 when fresh).
      checkpoint: the model checkpoint to restore, or None.
      origin: the delivered set the pipelines are built from (``exclude=``).
      segment: the current segment record (saved in every checkpoint of this run).
      previous: the segment that wrote the checkpoint, when a new one starts, else None.
      reason: why the resume is not exact, when it is not.
    """

    kind: str
    step: int
    checkpoint: str | None
    origin: DeliveredSet
    segment: dict[str, Any]
    previous: dict[str, Any] | None
    reason: str | None = None


def origin_path(checkpoint_dir: str, digest: str) -> str:
    return os.path.join(checkpoint_dir, "input", f"origin-{digest}.bin")


def _write_origin(checkpoint_dir: str, origin: DeliveredSet) -> None:
    import tensorflow as tf

    path = origin_path(checkpoint_dir, origin.digest())
    if tf.io.gfile.exists(path):
        return
    tf.io.gfile.makedirs(os.path.dirname(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "wb") as f:
        f.write(origin.to_bytes())
    tf.io.gfile.rename(tmp, path, overwrite=True)


def _read_origin(checkpoint_dir: str, digest: str) -> DeliveredSet | None:
    import tensorflow as tf

    from tfrecord_io.delivery import DeliveredSet

    path = origin_path(checkpoint_dir, digest)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        value, _ = DeliveredSet.from_bytes(f.read())
    return value if value.digest() == digest else None


def describe_layout_change(before: dict[str, Any], after: dict[str, Any]) -> str:
    """``"num_workers 2 -> 1, service False -> True"``: what differs between two layouts."""
    keys = sorted(set(before) | set(after))
    changes = [
        f"{k} {before.get(k)!r} -> {after.get(k)!r}" for k in keys if before.get(k) != after.get(k)
    ]
    return ", ".join(changes) or "nothing"


def _has_delivered(checkpoint: str) -> bool:
    import tensorflow as tf

    names = [name for name, _ in tf.train.list_variables(checkpoint)]
    return any(name.startswith(f"{_DELIVERED_KEY}/") for name in names)


def plan_resume(
    checkpoint_dir: str,
    dist: Distribution,
    tracker: DeliveryTracker,
    *,
    layout: dict[str, Any],
    worker_batch: int,
    empty: DeliveredSet,
) -> ResumePlan:
    """Reads the latest checkpoint's delivered set into ``tracker`` and decides the resume.

    Args:
      checkpoint_dir: ``MODEL_DIR/checkpoints``.
      dist: this worker's place.
      tracker: receives the checkpoint's delivered set (or ``empty``) and the new segment.
      layout: this run's input layout (what fixes the example order, workers and service).
      worker_batch: examples per step on each worker.
      empty: the delivered set of a fresh run (N, seed, split digest).

    Returns:
      The plan; the chief has written the origin file of a new segment.
    """
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(checkpoint_dir)
    step, previous, reason = 0, None, None
    if latest is None:
        kind = "fresh"
        tracker.reset(empty, meta={})
    elif not _has_delivered(latest):
        kind, reason = "restart", f"{latest} holds no delivered set (written by an older trainer)"
        tracker.reset(empty, meta={})
        step = _checkpoint_step(latest)
    else:
        tf.train.Checkpoint(**{_DELIVERED_KEY: tracker}).read(latest).expect_partial()
        step = _checkpoint_step(latest)
        saved = tracker.delivered
        previous = dict(tracker.meta.get("segment") or {})
        if saved.split != empty.split or saved.num_examples != empty.num_examples:
            kind = "restart"
            reason = (
                f"the split changed (digest {saved.split}, {saved.num_examples} examples -> "
                f"{empty.split}, {empty.num_examples}): the delivered indices would name other "
                "examples"
            )
            tracker.reset(dataclasses.replace(empty, epoch=saved.epoch), meta={})
        else:
            kind, reason = _same_or_elastic(checkpoint_dir, dist, previous, layout, step)
    if kind == "exact":
        origin = _read_origin(checkpoint_dir, previous["origin"])  # type: ignore[index]
        assert origin is not None  # checked by _same_or_elastic
        segment = previous
        previous = None
    else:
        origin = tracker.delivered
        segment = {
            "start": step,
            "layout": layout,
            "worker_batch": worker_batch,
            "num_workers": dist.num_workers,
            "origin": origin.digest(),
        }
        tracker.meta = {"segment": segment}
        if dist.is_chief:
            _write_origin(checkpoint_dir, origin)
    return ResumePlan(kind, step, latest, origin, segment, previous or None, reason)  # type: ignore[arg-type]


def _checkpoint_step(path: str) -> int:
    return int(path.rsplit("-", 1)[1])


def _same_or_elastic(
    checkpoint_dir: str,
    dist: Distribution,
    previous: dict[str, Any],
    layout: dict[str, Any],
    step: int,
) -> tuple[str, str | None]:
    import tensorflow as tf

    before = previous.get("layout") or {}
    if before != layout:
        return "elastic", f"the input layout changed: {describe_layout_change(before, layout)}"
    if layout.get("service"):
        return "elastic", "the tf.data service's position cannot be saved"
    if _read_origin(checkpoint_dir, str(previous.get("origin"))) is None:
        return "elastic", f"the segment's origin file is missing (origin {previous.get('origin')})"
    if step != previous.get("start"):
        missing = [
            k
            for k in range(dist.num_workers)
            if not tf.io.gfile.exists(
                os.path.join(checkpoint_dir, "input", f"worker-{k:05d}", f"ckpt-{step}.index")
            )
        ]
        if missing:
            return "elastic", f"no iterator checkpoint at step {step} for worker(s) {missing}"
    return "exact", None


def agree_on_nonce(dist: Distribution) -> int:
    """A random 31-bit number the chief draws and every worker receives (one all-reduce).

    It names this run's tf.data service job, which every worker must join and no other run
    may: a job rejoined by name goes on from where the service stood.
    """
    import secrets

    value = secrets.randbits(31) if dist.is_chief else 0
    if dist.num_workers == 1:
        return value
    import tensorflow as tf

    strategy = dist.strategy

    @tf.function(autograph=False)
    def broadcast() -> Any:
        def share() -> tf.Tensor:
            ctx = tf.distribute.get_replica_context()
            first = tf.equal(ctx.replica_id_in_sync_group, 0)
            mine = tf.where(
                first, tf.constant(float(value), tf.float64), tf.constant(0.0, tf.float64)
            )
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, mine)

        return strategy.experimental_local_results(strategy.run(share))[0]

    return int(broadcast().numpy())
