"""dcgan-reference: a DCGAN trainer that reads as a worked example of PyTorch technique.

Data flows one way: train.py -> gan.config -> gan.data, gan.core.models -> gan.core.steps -> gan.training
(monitor, checkpoint). gan.core.models and gan.core.losses import nothing else from this package.
"""
