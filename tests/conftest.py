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
# resumed), with their seconds in a whole run (`--durations`, docs/development.md): only their
# relative sizes matter.
LONG_MODULES = {
    "tests/test_engines_jvm.py": 330,
    "tests/test_resume.py": 138,
    "tests/test_torch_resume.py": 120,
    "tests/test_service.py": 95,
    "tests/test_elastic_resume.py": 91,
    "tests/test_fit_callback.py": 84,
    "tests/test_train_cli.py": 82,
    "tests/test_own_model.py": 70,
    "tests/test_interrupts.py": 69,
    "tests/test_object_store_e2e.py": 63,
    "tests/test_first_day.py": 48,
    "tests/test_export_predict.py": 45,
    "tests/test_fuzz.py": 21,
    "tests/test_readme_snippets.py": 18,
}


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Orders the tests so that each pytest worker starts with its share of ``LONG_MODULES``
    and ends with short tests.

    The last test a worker runs sets when the suite ends: a minute-long process chain started
    last leaves the other core idle for that minute, where short tests at the end let both
    workers finish together (the longest-first rule of scheduling). xdist's ``worksteal``
    hands each worker a contiguous run of this order first (``remaining // workers_left``
    tests), and an idle worker takes the back half of another's queue. So the long modules
    are dealt into one bin a worker (the longest to the least loaded), and each bin is
    followed by short tests up to its worker's first run: what is ever stolen is short. In
    one process it is longest first. Modules stay contiguous, so their module-scoped fixtures
    are set up once.
    """
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    long_tests: dict[str, list[pytest.Item]] = {module: [] for module in LONG_MODULES}
    short: list[pytest.Item] = []
    for item in items:
        long_tests.get(_module(item), short).append(item)
    bins: list[list[pytest.Item]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for module in sorted(LONG_MODULES, key=LONG_MODULES.__getitem__, reverse=True):
        if long_tests[module]:
            least = loads.index(min(loads))
            bins[least] += long_tests[module]
            loads[least] += LONG_MODULES[module]
    ordered: list[pytest.Item] = []
    remaining, next_short = len(items), 0
    for i, tests in enumerate(bins):
        first_run = remaining // (workers - i)
        fill = max(0, first_run - len(tests))
        ordered += tests + short[next_short : next_short + fill]
        next_short += fill
        remaining -= first_run
    items[:] = ordered + short[next_short:]
