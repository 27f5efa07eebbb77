"""Builds that start from earlier work: incremental builds on a base dataset
(``incremental``), the base's splits that a stratified build on it keeps (``base_splits``)
and resuming a stopped build (``resume``)."""

__all__: list[str] = []
