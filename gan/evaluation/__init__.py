"""Evaluation: evaluate() (pipeline.py) measures a trained generator with the instruments of metrics.py
(feature classifier, FID/KID, precision/recall, density/coverage, class coverage), draws grids.py's
pictures and writes export.py's TorchScript or torch.export files."""
