"""One rank of a DDP-style job over ``tfrecord_io.torch`` (started by the tests, one process per
rank, ``gloo`` on loopback).

Each step gathers every rank's example indices (rank order, so a step's list is its stream
positions in order) and rank 0 appends them to ``--log`` as a JSON line, flushed; every
``--checkpoint_every`` steps rank 0 saves ``{"step": ..., "loader": loader.state_dict()}`` to
``--checkpoint`` (a temporary file, then renamed), after logging that step. A resumed run loads
the checkpoint into the dataset before building its loader, on whatever number of ranks and
workers it has. With ``--train`` each rank also trains torchvision's ResNet-18 under
``DistributedDataParallel``.

Usage: RANK=r WORLD_SIZE=w MASTER_ADDR=127.0.0.1 MASTER_PORT=p python -m tests.torch_ddp_job
    --data DIR --log F --checkpoint F [--resume] [--passes 1] [--workers 2] ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

import tfrecord_io.torch as tt


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--resume", action="store_true")
    # Resume through StatefulDataLoader.load_state_dict (the same number of workers) instead of
    # the dataset's load_state_dict before the loader is built (any topology).
    parser.add_argument("--resume_loader", action="store_true")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--global_batch_size", type=int, default=12)
    parser.add_argument("--checkpoint_every", type=int, default=2)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--cache_dir", default="")
    return parser.parse_args(argv)


def _save(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _model(num_classes: int) -> torch.nn.Module:
    import torchvision

    model = torchvision.models.resnet18(num_classes=num_classes)
    return torch.nn.parallel.DistributedDataParallel(model)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    options: dict = {"global_batch_size": args.global_batch_size, "seed": 7}
    options.update(with_index=True, image_size=args.image_size, window_shards=2)
    if args.cache_dir:
        from tfrecord_io.cache import CacheConfig

        options["shard_cache"] = CacheConfig(cache_dir=args.cache_dir, cache_bytes=1 << 30)
    ds = tt.dataset(args.data, "train", **options)
    step, saved = 0, None
    if args.resume:
        saved = torch.load(args.checkpoint, weights_only=False)
        step = saved["step"]
        if not args.resume_loader:
            ds.load_state_dict(saved["loader"])
    loader = StatefulDataLoader(
        ds, batch_size=None, num_workers=args.workers, persistent_workers=args.workers > 0
    )
    if saved is not None and args.resume_loader:
        loader.load_state_dict(saved["loader"])  # rank 0's state, on every rank
    model = _model(ds.num_classes) if args.train else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01) if model is not None else None
    log = open(args.log, "a") if rank == 0 else None
    first = ds.epoch
    for epoch in range(first, first + args.passes):
        batches = 0
        for images, labels, indices in loader:
            if model is not None and optimizer is not None:
                loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            gathered = [torch.zeros_like(indices) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, indices)
            step += 1
            batches += 1
            if log is not None:
                record = {"epoch": epoch, "step": step, "indices": torch.cat(gathered).tolist()}
                if model is not None:
                    record["loss"] = float(loss)
                log.write(json.dumps(record) + "\n")
                log.flush()
            if rank == 0 and step % args.checkpoint_every == 0:
                _save(args.checkpoint, {"step": step, "loader": loader.state_dict()})
            time.sleep(args.step_sleep)
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
        dist.all_gather(counts, torch.tensor([batches]))
        if log is not None:
            log.write(json.dumps({"epoch": epoch, "batches_per_rank": [int(c) for c in counts]}))
            log.write("\n")
            log.flush()
    if log is not None:
        log.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
