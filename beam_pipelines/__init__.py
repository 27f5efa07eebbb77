"""beam_pipelines package."""

__all__: list[str] = []
