"""Is D memorising? Its scores on training reals against held-out reals drift apart well before FID turns worse
(Karras et al. 2020, fig. 1). Training is untouched: D's buffers are put back and no random number is drawn."""

import logging
from typing import Optional

import torch
from torch import Tensor, nn

from gan.config import TrainConfig
from gan.core.steps import StepContext
from gan.data import EmptySplitError, ImageSet, open_source, take, to_unit_range
from gan.errors import DataError

log = logging.getLogger(__name__)

# enough for a mean score to move by less than the gap it shows
PROBE_IMAGES = 512
_SUBSET_SEED = 20_200_611  # a generator of its own: the run's random streams are not touched
ImagesAndLabels = tuple[Tensor, Optional[Tensor]]  # images, and their labels in a conditional run


class OverfitProbe:
    def __init__(self, train: ImagesAndLabels, held_out: ImagesAndLabels, batch_size: int):
        self.train, self.held_out, self.batch_size = train, held_out, batch_size

    @torch.no_grad()
    def measure(self, D: nn.Module, ctx: StepContext) -> dict[str, float]:
        saved = [buffer.clone() for buffer in D.buffers()]
        try:
            train = self._mean_score(D, ctx, *self.train)
            held_out = self._mean_score(D, ctx, *self.held_out)
        finally:
            for buffer, value in zip(D.buffers(), saved):
                buffer.copy_(value)
        return {"d/score_train": train, "d/score_heldout": held_out, "d/heldout_gap": train - held_out}

    def _mean_score(self, D: nn.Module, ctx: StepContext, images: Tensor, labels: Optional[Tensor]) -> float:
        scores = []
        for start in range(0, images.size(0), self.batch_size):
            batch = to_unit_range(images[start : start + self.batch_size])
            y = labels[start : start + self.batch_size] if labels is not None else None
            with ctx.autocast():
                scores.append(D(batch, y).float())
        return float(torch.cat(scores).mean())


def build_probe(cfg: TrainConfig, train: ImageSet, device: torch.device) -> Optional[OverfitProbe]:
    """A run first opens the held-out split here, so one that needs it stops before it trains."""
    final_eval = cfg.trainer.final_eval_samples
    if not cfg.trainer.overfit_every and not final_eval:
        return None
    try:
        held_out = open_source(cfg.data, train=False)
    except DataError as err:
        if final_eval:
            raise DataError(
                f"{err} trainer.final_eval_samples={final_eval} measures the trained generator against this "
                "held-out split after training; fix the split, or set trainer.final_eval_samples=0."
            ) from err
        if isinstance(err, EmptySplitError):  # a small folder: nothing is wrong with the data
            log.info("No held-out images to compare D's scores with (%s): d/heldout_gap is not logged.", err)
        else:  # damaged or missing files: the run goes on, but the user must hear it before evaluate.py fails
            log.warning(
                f"The held-out split cannot be read: {err} Training goes on without D's held-out scores "
                "(d/heldout_gap, trainer.overfit_every); evaluate.py measures against this split and will refuse it "
                "until it is fixed."
            )
        return None
    if not cfg.trainer.overfit_every:
        return None
    count = min(PROBE_IMAGES, len(train.images), len(held_out))
    count -= count % cfg.model.pack  # D judges packs of model.pack images
    if count < cfg.model.pack:
        return None
    pick = torch.Generator().manual_seed(_SUBSET_SEED)
    subsets = []
    for images, labels in ((train.images, train.labels), (held_out, held_out.labels)):
        index = torch.randperm(len(images), generator=pick)[:count]
        subsets.append((take(images, index).to(device), labels[index].to(device) if cfg.model.conditional else None))
    return OverfitProbe(subsets[0], subsets[1], min(cfg.data.batch_size, count))
