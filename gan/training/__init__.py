"""Training: the loop and what it needs around the lesson in `gan.core`. (The checkpoint file, used by
training and evaluation alike, is `gan/checkpoint.py`, below both.)

- `loop.py`: train(), the loop itself (fetch, D step, G step, EMA), and the list of its periodic extras
  (log, sample, FID, checkpoint, ...);
- `periodic.py`: the one mechanism behind those extras (`Every`, `Extras`): one call per step;
- `state.py`: the TrainingState (models, optimizers, EMA, scaler, batches, fixed z, step) and its builders;
- `hardware.py`: device, threads, allocator, precision policy, torch.compile;
- `faults.py`: the NaN watch and SIGINT/SIGTERM handling;
- `monitor.py`: TensorBoard (tag names, HParams session), the progress bar, the log lines, progress.gif;
- `quality.py`: FID, precision/recall and classes of the EMA generator every trainer.eval_every steps;

A run's folder, its record and the resume contract, shared with evaluate.py, are `gan/runs.py`.
"""

from gan.training.faults import NonFiniteLossError
from gan.training.loop import TrainResult, train

__all__ = ["NonFiniteLossError", "TrainResult", "train"]
