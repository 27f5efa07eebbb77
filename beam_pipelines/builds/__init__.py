"""Builds that start from earlier work: incremental builds on a base dataset
(``incremental``) and resuming a stopped build (``resume``)."""

__all__: list[str] = []
