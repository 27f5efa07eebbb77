"""Shared pytest fixtures. Each area keeps its fixtures in tests/fixtures/<area>.py."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tests.fixtures.dask_cluster import *  # noqa: F403
from tests.fixtures.data_service import *  # noqa: F403
from tests.fixtures.flink_cluster import *  # noqa: F403
from tests.fixtures.images import *  # noqa: F403
from tests.fixtures.object_store import *  # noqa: F403
from tests.fixtures.pipeline_datasets import *  # noqa: F403
from tests.fixtures.shards import *  # noqa: F403
from tests.fixtures.spark_cluster import *  # noqa: F403
