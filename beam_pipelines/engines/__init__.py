"""Where the pipeline runs: runner names and their checks (``runners``), the corrected Dask
runner (``dask_runner``), Flink and Spark through Beam's job servers (``flink``, ``spark``,
``portable``, with pinned ``versions`` and ``local_clusters`` for this machine), and Beam
FileSystems for object stores (``filesystems``)."""

__all__: list[str] = []
