"""Where the pipeline runs: runner names and their checks (``runners``), the
corrected Dask runner (``dask_runner``), and Beam FileSystems for object stores
(``filesystems``)."""

__all__: list[str] = []
