"""Evaluation: how good a trained generator is, and its samples and exports.

- `pipeline.py`: evaluate(), the sections in order (checkpoint, data, instruments, samples, measure,
  pictures, outputs, report);
- `metrics.py`: the instruments: the offline feature classifier, FID/KID, precision/recall,
  density/coverage, class and mode coverage;
- `grids.py`: interpolation and nearest-neighbour pictures;
- `export.py`: the generator as TorchScript or torch.export files.
"""
