"""dcgan-reference: a DCGAN trainer that reads as a worked example of PyTorch technique.

Data flows one way: train.py -> gan.config -> gan.data, gan.models -> gan.steps -> gan.training
(monitor, checkpoint). gan.models and gan.losses import nothing else from this package.
"""
