"""Images from a trained generator: `python generate.py checkpoint=PATH [num=64] [out=DIR] [key=value ...]` (pip:
`dcgan-generate`), a Hydra app as train.py and evaluate.py are. Writes DIR/000000.png, ... and DIR/samples.npz
(uint8, N x H x W x C under `arr_0`); reads no dataset and measures nothing. Exit codes: 0 done; 2 bad input
(an override, the config, the checkpoint, the output folder).
"""

import logging
import sys
from typing import NoReturn, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from gan import launch
from gan.config import GenerateConfig, validate_and_check
from gan.errors import RunDirError, UserError, environment_error
from gan.run import Run

log = logging.getLogger("generate")
EXIT_BAD_INPUT = 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    return launch.run_hydra(job, "generate", list(sys.argv[1:] if argv is None else argv))


def job(cfg: DictConfig) -> tuple[int, None]:
    import torch  # the job's imports, not --help's or a TAB's of shell completion

    from gan.api import load_generator
    from gan.evaluation.pipeline import check_class_id, generate, write_samples

    out = Run(HydraConfig.get().runtime.output_dir)
    try:
        settings: GenerateConfig = validate_and_check(cfg, GenerateConfig)
        if (out.dir / "samples.npz").exists():
            raise RunDirError(
                f"{out.dir} already holds generated images (samples.npz): new ones would replace some of its PNGs and "
                "leave the others. Nothing was written. Choose another out=DIR, or move that folder away."
            )
        G = load_generator(settings.checkpoint, settings.use_ema, settings.device)
        check_class_id(settings.class_id, G.num_classes, settings.checkpoint)
        classes = None
        if G.num_classes:  # the class asked for, else 0, 1, 2, ... in turn
            every = torch.arange(settings.num) % G.num_classes
            classes = every if settings.class_id is None else torch.full_like(every, settings.class_id)
        device = next(G.parameters()).device
        images = generate(G, settings.num, settings.batch_size, settings.seed, device, classes)
        write_samples(images, npz=out.dir / "samples.npz", pngs=out.dir)
    except (UserError, OSError) as err:
        log.error("%s", environment_error(err, then="run the same command again.") if isinstance(err, OSError) else err)
        out.remove_if_empty()
        return EXIT_BAD_INPUT, None
    log.info("Wrote %d images (%s) and samples.npz into %s", len(images), "x".join(map(str, images.shape[1:])), out.dir)
    return 0, None


def cli(program: str = "python generate.py") -> NoReturn:
    launch.start("generate", main, program)


if __name__ == "__main__":
    cli()
