"""Shared pytest fixtures. Each area keeps its fixtures in tests/fixtures/<area>.py."""

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tests.fixtures.dask_cluster import *  # noqa: F403
from tests.fixtures.data_service import *  # noqa: F403
from tests.fixtures.flink_cluster import *  # noqa: F403
from tests.fixtures.images import *  # noqa: F403
from tests.fixtures.object_store import *  # noqa: F403
from tests.fixtures.pipeline_datasets import *  # noqa: F403
from tests.fixtures.shards import *  # noqa: F403
from tests.fixtures.spark_cluster import *  # noqa: F403


@pytest.fixture(autouse=True)
def _no_global_tensorflow_seed():
    """Unsets TensorFlow's global seed after each test. The trainer sets it (as
    keras.utils.set_random_seed); left set, it would give every op built without a seed in a
    later test of the same worker a seed drawn from a counter, so two identical pipelines built
    one after the other would differ (and, on the tf.data service, get two jobs)."""
    yield
    tensorflow = sys.modules.get("tensorflow")
    if tensorflow is not None:
        tensorflow.random.set_seed(None)
