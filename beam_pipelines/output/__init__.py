"""Stage 4, output: records staged durably (``staging``), written into shards
(``shards``), catalogs and index files (``catalog_io``), reports (``reports``), the records a
resumed build can skip (``done_records``), and the publication of ``dataset.json``
(``publish``)."""

__all__: list[str] = []
