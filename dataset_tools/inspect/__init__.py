"""``inspect``: an HTML report of a dataset: samples, classes, rejects and leakage
(``python -m dataset_tools.inspect``)."""

from dataset_tools.inspect.inspection import Report, gather
from dataset_tools.inspect.report_html import write_report

__all__ = ["Report", "gather", "write_report"]
