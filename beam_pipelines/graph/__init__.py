"""Stage 3, the Beam graph: the composite transforms (``transforms``), the split
assignment (``splits``), the shard plan (``plan``) and the train/validation leakage search
(``leakage``)."""

__all__: list[str] = []
