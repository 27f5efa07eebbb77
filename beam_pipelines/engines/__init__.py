"""Where the pipeline runs: runner names and their checks (``runners``), the corrected Dask
runner (``dask_runner``) and the primitive steps it translates (``dask_primitives``), Flink
and Spark through Beam's job servers (``flink``, ``spark``, ``portable``, with pinned
``versions`` and ``local_clusters`` for this machine), and Beam FileSystems for object stores
(``filesystems``). The one module that uses Beam's private names is ``beam_internals``."""

__all__: list[str] = []
