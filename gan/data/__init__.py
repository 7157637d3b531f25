"""Datasets (sources.py: `load_dataset(cfg.data)` -> an ImageSet) and the float batches of stream.py's BatchStream."""

from gan.data.sources import EmptySplitError, ImageSet, is_held_out, load_dataset, open_source, render_digits, take
from gan.data.stream import BatchStream, EpochBatchSampler, to_unit_range
from gan.errors import DataError

__all__ = ["BatchStream", "DataError", "EmptySplitError", "EpochBatchSampler", "ImageSet", "is_held_out"]
__all__ += ["load_dataset", "open_source", "render_digits", "take", "to_unit_range"]
