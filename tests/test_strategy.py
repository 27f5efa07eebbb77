"""Strategy factory: resolution from the environment, errors, Slurm, worker layout, batches."""

from __future__ import annotations

import json
import os

import pytest

from trainer.strategy import (
    create_distribution,
    precision_policy,
    resolve_strategy_name,
    slurm_cluster_resolver,
    split_batch,
    worker_layout,
)

TWO_WORKERS = json.dumps(
    {
        "cluster": {"worker": ["127.0.0.1:1111", "127.0.0.1:2222"]},
        "task": {"type": "worker", "index": 1},
    }
)
ONE_WORKER = json.dumps(
    {"cluster": {"worker": ["127.0.0.1:1111"]}, "task": {"type": "worker", "index": 0}}
)
SLURM_STEP = {
    "SLURM_PROCID": "1",
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURM_STEP_NODELIST": "node[01-02]",
    "SLURM_STEP_TASKS_PER_NODE": "2,1",
}


@pytest.mark.parametrize(
    ("requested", "environ", "gpus", "cpu_replicas", "tpu", "expected"),
    [
        ("auto", {}, 0, 1, None, ("one_device", None)),
        ("auto", {}, 1, 1, None, ("one_device", None)),
        ("auto", {}, 4, 1, None, ("mirrored", None)),
        ("auto", {}, 0, 2, None, ("mirrored", None)),
        ("auto", {"TF_CONFIG": TWO_WORKERS}, 0, 1, None, ("multi_worker", "tf_config")),
        ("auto", {"TF_CONFIG": ONE_WORKER}, 0, 1, None, ("one_device", None)),
        ("auto", SLURM_STEP, 0, 1, None, ("multi_worker", "slurm")),
        (
            "auto",
            {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"},
            2,
            1,
            None,
            ("mirrored", None),
        ),
        ("auto", {"TPU_NAME": "my-tpu"}, 0, 1, None, ("tpu", "tpu")),
        ("auto", {}, 0, 1, "", ("tpu", "tpu")),
        ("mirrored", {}, 0, 1, None, ("mirrored", None)),
        ("one_device", {"TF_CONFIG": TWO_WORKERS}, 0, 1, None, ("one_device", None)),
        ("multi_worker", {}, 0, 1, None, ("multi_worker", None)),
        ("multi_worker", SLURM_STEP, 0, 1, None, ("multi_worker", "slurm")),
        ("tpu", {}, 0, 1, None, ("tpu", "tpu")),
    ],
)
def test_resolve_strategy_name(requested, environ, gpus, cpu_replicas, tpu, expected):
    got = resolve_strategy_name(
        requested, environ=environ, num_gpus=gpus, cpu_replicas=cpu_replicas, tpu=tpu
    )
    assert got == expected


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match=r"Unrecognized Distribution Strategy: 'parameter_server'"):
        resolve_strategy_name("parameter_server", environ={}, num_gpus=0)


def test_factory_rejects_unknown_strategy_before_touching_devices():
    with pytest.raises(ValueError, match=r"Unrecognized Distribution Strategy: 'x'"):
        create_distribution("x", environ={})


@pytest.mark.parametrize(
    ("requested", "gpus", "match"),
    [
        ("one_device", 0, "cannot be used with strategy 'one_device'"),
        ("multi_worker", 0, "cannot be used with strategy 'multi_worker'"),
        ("tpu", 0, "cannot be used with strategy 'tpu'"),
        ("mirrored", 2, "for machines without a GPU"),
    ],
)
def test_cpu_replicas_only_with_mirrored_on_cpu(requested, gpus, match):
    with pytest.raises(ValueError, match=match):
        resolve_strategy_name(requested, environ={}, num_gpus=gpus, cpu_replicas=2)


def test_malformed_tf_config_is_reported():
    with pytest.raises(ValueError, match="TF_CONFIG is not a JSON object"):
        resolve_strategy_name("auto", environ={"TF_CONFIG": "{not json"}, num_gpus=0)


def test_malformed_slurm_task_count_is_reported():
    with pytest.raises(ValueError, match="SLURM_STEP_NUM_TASKS must be an integer"):
        resolve_strategy_name(
            "auto", environ={"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "two"}, num_gpus=0
        )


@pytest.mark.parametrize(
    ("device", "enabled", "policy"),
    [
        ("GPU", True, "mixed_float16"),
        ("TPU", True, "mixed_bfloat16"),
        ("CPU", True, "mixed_bfloat16"),
        ("GPU", False, "float32"),
        ("TPU", False, "float32"),
    ],
)
def test_precision_policy(device, enabled, policy):
    assert precision_policy(device, enabled) == policy


def test_precision_policy_rejects_unknown_device():
    with pytest.raises(ValueError, match="'NPU'"):
        precision_policy("NPU", True)


def test_worker_layout_numbers_the_chief_first():
    cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    assert worker_layout(cluster, "chief", 0) == (3, 0)
    assert worker_layout(cluster, "worker", 0) == (3, 1)
    assert worker_layout(cluster, "worker", 1) == (3, 2)
    assert worker_layout({"worker": ["b:1", "c:1"]}, "worker", 1) == (2, 1)
    with pytest.raises(ValueError, match="'evaluator':0 is not a chief or worker"):
        worker_layout(cluster, "evaluator", 0)
    with pytest.raises(ValueError, match="'worker':5"):
        worker_layout(cluster, "worker", 5)


def test_slurm_resolver_on_cpu_nodes(monkeypatch):
    # The variables srun sets for task 1 of 3 over two nodes (2 tasks on node01, 1 on node02).
    for name, value in SLURM_STEP.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    resolver = slurm_cluster_resolver(port_base=9000, num_gpus=0, environ=SLURM_STEP)
    spec = resolver.cluster_spec().as_dict()
    assert spec == {"worker": ["node01:9000", "node01:9001", "node02:9000"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert worker_layout(spec, resolver.task_type, resolver.task_id) == (3, 1)
    # On CPU nodes the resolver must not hide devices from the process.
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_slurm_resolver_rejects_bad_tasks_per_node():
    with pytest.raises(ValueError, match="SLURM_STEP_TASKS_PER_NODE has a bad entry 'x2'"):
        slurm_cluster_resolver(
            port_base=9000, num_gpus=0, environ={**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "x2"}
        )


def test_one_device_distribution_batches_and_input_context():
    dist = create_distribution("one_device", environ={})
    assert (dist.name, dist.device_kind, dist.num_replicas) == ("one_device", "CPU", 1)
    assert dist.is_chief and dist.num_workers == 1 and dist.local_replicas == 1
    assert dist.worker_batch_size(256) == 256
    context = dist.input_context()
    assert (context.num_input_pipelines, context.input_pipeline_id) == (1, 0)
    assert context.get_per_replica_batch_size(256) == 256


@pytest.mark.parametrize(
    ("global_batch", "workers", "local", "expected"),
    [
        (256, 1, 1, (256, 256)),
        (256, 1, 8, (256, 32)),
        (256, 4, 8, (64, 8)),
        (8, 2, 1, (4, 4)),
        (8, 1, 2, (8, 4)),
    ],
)
def test_split_batch_divides_the_global_batch_once(global_batch, workers, local, expected):
    assert split_batch(global_batch, workers, local) == expected


@pytest.mark.parametrize(
    ("global_batch", "workers", "local", "match"),
    [
        (10, 4, 1, "global_batch_size 10 must be divisible by the 4 replicas"),
        (12, 2, 4, r"8 replicas in sync \(2 workers x 4 local replicas\)"),
        (0, 1, 1, "global_batch_size must be an int >= 1, got 0"),
        (8, 0, 1, "num_workers must be an int >= 1, got 0"),
    ],
)
def test_split_batch_rejects_uneven_splits(global_batch, workers, local, match):
    with pytest.raises(ValueError, match=match):
        split_batch(global_batch, workers, local)
