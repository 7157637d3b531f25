"""Training: train() and what it needs around the lesson in `gan.core`: the loop (loop.py), its state,
its periodic extras (TensorBoard, samples, FID, checkpoints), precision, faults and threads. A run's
folder, record and resume contract, shared with evaluate.py, are `gan/run.py` and `gan/launch.py`."""

from gan.training.faults import NonFiniteLossError
from gan.training.loop import TrainResult, train

__all__ = ["NonFiniteLossError", "TrainResult", "train"]
