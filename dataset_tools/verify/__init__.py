"""``verify``: every shard of a dataset checked against ``dataset.json``, and its index files
and catalogs against the shards (``python -m dataset_tools.verify``)."""

from dataset_tools.verify.checks import verify_foreign, verify_keys
from dataset_tools.verify.verification import ShardReport, VerifyReport, verify_dataset

__all__ = ["ShardReport", "VerifyReport", "verify_dataset", "verify_foreign", "verify_keys"]
