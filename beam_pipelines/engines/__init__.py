"""Runners beyond the in-process one: Flink and Spark clusters through Beam's job servers."""

__all__: list[str] = []
