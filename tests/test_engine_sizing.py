"""How a build sizes Flink's tasks and Spark's partitions for the inputs a listing names:
Beam's runners on both hold a task's whole partition at once (docs/scale.md)."""

from __future__ import annotations

import logging

import pytest
from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    JobServerOptions,
    PipelineOptions,
)

from beam_pipelines import images_to_tfrecord
from beam_pipelines.engines import flink, spark
from beam_pipelines.engines.runners import FLINK_RUNNER, SPARK_RUNNER


def _parallelism(options: PipelineOptions) -> int | None:
    return options.view_as(FlinkRunnerOptions).parallelism


def _properties(options: PipelineOptions) -> list[str]:
    return list(options.view_as(JobServerOptions).job_server_jvm_properties or [])


@pytest.mark.parametrize(
    "images, expected",
    [(10_000, 2), (1_000_000, 2), (1_004_000, 2), (1_100_000, 3), (3_000_000, 6)],
)
def test_flink_parallelism_not_given_gives_a_task_at_most_500k_images(images, expected):
    options = PipelineOptions(["--runner", FLINK_RUNNER])
    flink.size_parallelism(options, images)
    assert _parallelism(options) == expected


def test_flink_parallelism_given_is_kept_with_a_warning_when_too_low(caplog):
    options = PipelineOptions(["--parallelism", "2"])
    with caplog.at_level(logging.WARNING):
        flink.size_parallelism(options, 3_000_000)
    assert _parallelism(options) == 2
    assert "--parallelism 2 gives each task about 1,500,000" in caplog.text
    assert "--parallelism 6 or more" in caplog.text
    caplog.clear()
    enough = PipelineOptions(["--parallelism", "8"])
    with caplog.at_level(logging.WARNING):
        flink.size_parallelism(enough, 3_000_000)
    assert _parallelism(enough) == 8 and not caplog.text


def test_spark_parallelism_is_given_to_a_driver_started_for_the_job():
    options = PipelineOptions([])
    spark.size_partitions(options, 1_000_000)
    assert _properties(options) == ["-Dspark.default.parallelism=20"]
    small = PipelineOptions([])
    spark.size_partitions(small, 100_000)  # two partitions: the cores' default does
    assert _properties(small) == []


def test_spark_parallelism_a_running_driver_or_a_lower_given_one_only_warns(caplog):
    kept = PipelineOptions(["--job_endpoint", "127.0.0.1:8099"])
    with caplog.at_level(logging.WARNING):
        spark.size_partitions(kept, 3_000_000)
    assert _properties(kept) == []
    assert "spark.default.parallelism >= 60" in caplog.text and "--job_endpoint" in caplog.text
    caplog.clear()
    low = PipelineOptions(["--job_server_jvm_properties=-Dspark.default.parallelism=4"])
    with caplog.at_level(logging.WARNING):
        spark.size_partitions(low, 3_000_000)
    assert _properties(low) == ["-Dspark.default.parallelism=4"]
    assert "-Dspark.default.parallelism=60" in caplog.text


@pytest.mark.parametrize("runner", [FLINK_RUNNER, SPARK_RUNNER, None])
def test_the_launcher_sizes_only_the_engine_it_runs_on_and_only_for_a_listing(runner):
    options = PipelineOptions(["--runner", runner] if runner else [])
    images_to_tfrecord._size_engine_tasks(options, None)  # a directory: size unknown
    assert _parallelism(options) == -1 and _properties(options) == []  # -1: not given
    images_to_tfrecord._size_engine_tasks(options, 3_000_000)
    assert _parallelism(options) == (6 if runner == FLINK_RUNNER else -1)
    spark_sized = ["-Dspark.default.parallelism=60"] if runner == SPARK_RUNNER else []
    assert _properties(options) == spark_sized


def test_flink_refuses_more_tasks_than_the_clusters_slots():
    # Beam's Flink runner asks for all of a batch job's slots at once: more would wait forever.
    overview = {"taskmanagers": 1, "slots-total": 2}
    with pytest.raises(ValueError, match=r"--parallelism 6 is more than the 2 task slots") as e:
        flink._check_slots(6, flink._total_slots(overview), "127.0.0.1:8081")
    assert "--slots 6" in str(e.value) and "--parallelism 2" in str(e.value)
    flink._check_slots(2, flink._total_slots(overview), "127.0.0.1:8081")  # as many: runs
    flink._check_slots(6, flink._total_slots(None), "127.0.0.1:8081")  # no overview: unchecked


@pytest.mark.parametrize(
    "overview, expected",
    [
        ({"taskmanagers": 3, "slots-total": 6}, 2),
        ({"taskmanagers": 1, "slots-total": 6}, 6),
        ({"taskmanagers": 0, "slots-total": 0}, None),
        (None, None),
    ],
)
def test_flink_runs_an_sdk_worker_a_slot_of_each_taskmanager(overview, expected):
    assert flink._slots_per_taskmanager(overview) == expected


def test_flink_parallelism_not_given_stops_at_the_clusters_slots(monkeypatch, caplog):
    monkeypatch.setattr(flink, "_overview", lambda master: {"taskmanagers": 1, "slots-total": 4})
    options = PipelineOptions(["--flink_master", "127.0.0.1:8081"])
    with caplog.at_level(logging.WARNING):
        flink.size_parallelism(options, 3_000_069)  # an estimate: 6 tasks, not 7
    assert _parallelism(options) == 4
    assert "want 6 tasks" in caplog.text and "4 task slots" in caplog.text
    assert "give it 6 slots" in caplog.text
    caplog.clear()
    fits = PipelineOptions(["--flink_master", "127.0.0.1:8081"])
    with caplog.at_level(logging.WARNING):
        flink.size_parallelism(fits, 1_500_000)
    assert _parallelism(fits) == 3 and not caplog.text
