"""tfrecord_io.torch: the same datasets for PyTorch trainers, without TensorFlow.

``dataset(path, split, global_batch_size=..., **options)`` returns an ``ImageDataset``, a
``torch.utils.data.IterableDataset`` of whole batches for this rank, for
``DataLoader(ds, batch_size=None, num_workers=...)`` or torchdata's ``StatefulDataLoader``::

    import tfrecord_io.torch as tt
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = tt.dataset("s3://bucket/imagenet", "train", global_batch_size=256, seed=0)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=8, pin_memory=True)
    for epoch in range(ds.epoch, 90):
        for images, labels in loader:   # [B, 3, 224, 224] uint8, [B] int64
            ...
        torch.save({"model": ..., "loader": loader.state_dict()}, path)

Resuming: ``ds.load_state_dict(saved["loader"])`` before building the loader, on any number of
ranks and workers (or ``loader.load_state_dict`` on the same number of workers). The options
are ``LoaderConfig``'s fields. Needs the ``torch`` extra:
``pip install 'tfrecord-service[torch]'``.
"""

from tfrecord_io.torch.dataset import ImageDataset
from tfrecord_io.torch.factory import dataset
from tfrecord_io.torch.options import LoaderConfig
from tfrecord_io.torch.state import STATE_FORMAT

__all__ = ["STATE_FORMAT", "ImageDataset", "LoaderConfig", "dataset"]
