"""Stage 1, inputs: matching image files and reading listings (``sources``).

Modules are imported by their full names; the pipeline's public API is ``beam_pipelines``."""

__all__: list[str] = []
