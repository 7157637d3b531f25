"""dcgan-reference: a DCGAN trainer that reads as a worked example of PyTorch technique.

Data flows one way: train.py -> gan.config -> gan.data, gan.core.models -> gan.core.steps -> gan.training
(monitor, checkpoint). gan.core.models and gan.core.losses import nothing else from this package.
"""

API = ("train", "load_generator", "sample", "compose_config")  # gan/api.py, imported on first use


def __getattr__(name: str) -> object:
    if name in API:
        from gan import api

        return getattr(api, name)
    raise AttributeError(f"module 'gan' has no attribute {name!r}")
