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


# Modules whose tests are minute-long chains of processes (clusters, trainers killed and
# resumed), longest first, as measured by `--durations` (docs/development.md).
LONGEST_FIRST = (
    "tests/test_engines_jvm.py",
    "tests/test_train_cli.py",
    "tests/test_fit_callback.py",
    "tests/test_elastic_resume.py",
    "tests/test_own_model.py",
    "tests/test_service.py",
    "tests/test_resume.py",
    "tests/test_first_day.py",
    "tests/test_readme_snippets.py",
    "tests/test_object_store_e2e.py",
    "tests/test_fuzz.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs the modules of ``LONGEST_FIRST`` first, each module's tests in their own order.

    The last test a worker runs sets when the suite ends: a minute-long process chain started
    last leaves the other core idle for that minute, where short tests at the end let both
    workers finish together (the longest-first rule of scheduling). Modules stay contiguous,
    so their module-scoped fixtures are set up once.
    """
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
