"""tfrecord_io package."""

__all__: list[str] = []
