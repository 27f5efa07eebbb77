"""Tools for a finished dataset: verify, inspect, diff and adopt.

None of them imports TensorFlow at import time: ``diff`` and ``inspect`` never need it, and
``verify`` imports it only to decode images (``--deep``); ``adopt`` and ``verify`` read
foreign examples through ``dataset_tools.foreign``, without it. The commands are
``python -m dataset_tools.verify|inspect|diff|adopt`` (``tfrecord-verify``, ``tfrecord-inspect``,
...); the command modules are not imported here, so ``python -m`` runs each once.
"""

from dataset_tools.inspect import Report, gather, write_report
from dataset_tools.keys import KeyCollector
from dataset_tools.verify import (
    ShardReport,
    VerifyReport,
    verify_dataset,
    verify_foreign,
    verify_keys,
)

__all__ = [
    "KeyCollector",
    "Report",
    "ShardReport",
    "VerifyReport",
    "gather",
    "verify_dataset",
    "verify_foreign",
    "verify_keys",
    "write_report",
]
