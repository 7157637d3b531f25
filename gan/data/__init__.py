"""Datasets and the batch stream: `load_dataset(cfg.data)` -> an ImageSet; `BatchStream` -> batches.
`digits.py` renders the built-in set, `sources.py` opens every dataset, `stream.py` makes the float batches."""

from gan.data.digits import render_digits
from gan.data.sources import (
    EmptySplitError,
    ImageSet,
    ImageSource,
    is_held_out,
    load_dataset,
    open_source,
    read_image,
    take,
)
from gan.data.stream import BatchStream, EpochBatchSampler, to_unit_range
from gan.errors import DataError

__all__ = ["BatchStream", "DataError", "EmptySplitError", "EpochBatchSampler", "ImageSet", "ImageSource"]
__all__ += ["is_held_out", "load_dataset", "open_source", "read_image", "render_digits", "take", "to_unit_range"]
