"""train() around the lesson in `gan.core`; a run's folder and resume contract are gan/run.py's and gan/launch.py's."""

from gan.training.faults import NonFiniteLossError as NonFiniteLossError
from gan.training.loop import TrainResult as TrainResult
from gan.training.loop import train as train
