"""Stage 3, the Beam graph: the composite transforms (``transforms``), the split
assignment (``splits``), the shard plan (``plan``), the train/validation leakage search
(``leakage``), the near-duplicate search on the engine (``near_duplicate_search``) and
the return of the heap pages its long bundles free (``heap``)."""

__all__: list[str] = []
