"""``verify``: every shard of a dataset checked against ``dataset.json``, and its index files
and catalogs against the shards (``python -m dataset_tools.verify``).

``verification`` holds the entry points, ``checks`` the checks they run, ``report`` what they
return.
"""

from dataset_tools.verify.report import ShardReport, VerifyReport
from dataset_tools.verify.verification import verify_dataset, verify_foreign, verify_keys

__all__ = ["ShardReport", "VerifyReport", "verify_dataset", "verify_foreign", "verify_keys"]
