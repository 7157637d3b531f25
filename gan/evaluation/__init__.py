"""evaluate() (pipeline.py) measures, draws and exports a trained generator with the instruments of metrics.py."""
