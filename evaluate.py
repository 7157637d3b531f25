"""Evaluate a trained generator. `python evaluate.py checkpoint=PATH [key=value ...]`; see configs/evaluate.yaml.

Measures FID, KID, precision/recall, density/coverage and class (or Stacked-MNIST mode) coverage
against the held-out split, in the feature space of a classifier trained on the dataset's labels
(offline) or of Inception-v3; draws sample, interpolation and nearest-neighbour grids; optionally
saves the samples and exports the generator. Everything goes into this run's directory:
metrics.json, *.png, tb/, export/.

The entry point only turns Hydra's DictConfig into a checked, typed config and hands it to
gan.evaluation.pipeline.evaluate(); it owns the exit codes, as train.py does.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gan.config import register_evaluate_configs, validate_evaluate
from gan.errors import UserError, environment_error
from gan.evaluation.pipeline import evaluate
from gan.training.runs import SweepJobFailed, override_key, preflight

log = logging.getLogger("evaluate")
register_evaluate_configs()

# Exit codes: 0 done; 2 bad input (config, checkpoint, data, a metric that cannot be measured).
EXIT_BAD_INPUT = 2


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg: DictConfig) -> float:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        results = evaluate(validate_evaluate(cfg), run_dir, data_overrides(cfg))
    except (UserError, OSError) as err:
        if isinstance(err, OSError):  # disk full, permissions: the environment, not a bug
            err = environment_error(err)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            # Hydra records the failed job, prints this paragraph (no traceback) and runs the others
            raise SweepJobFailed(str(err)) from err
        log.error("%s", err)
        sys.exit(EXIT_BAD_INPUT)
    log.info("Done in %.0f s; outputs in %s", results["seconds"]["total"], run_dir)
    return results["fid"]


def data_overrides(cfg: DictConfig) -> dict[str, Any]:
    """The data.* keys given on the command line, with the values Hydra typed: they replace the
    checkpoint's own. Everything else about the data comes from the checkpoint."""
    given = {override_key(o) for o in HydraConfig.get().overrides.task}
    keys = [key.split(".", 1)[1] for key in given if key.startswith("data.")]
    return {key: OmegaConf.to_container(cfg.data, resolve=True)[key] for key in keys}


if __name__ == "__main__":
    preflight(sys.argv, EXIT_BAD_INPUT)
    main()
