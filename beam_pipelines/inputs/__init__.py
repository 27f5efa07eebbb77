"""Stage 1, inputs: matching image files and reading listings (``sources``), listings parsed
by their formats (``listings``) in ranges of whole records cut for many workers
(``listing_ranges``).

Modules are imported by their full names; the pipeline's public API is ``beam_pipelines``."""

__all__: list[str] = []
