"""Is D memorising the training images? Its scores on training reals against held-out reals.

As D overfits, its outputs on training and held-out images drift apart well before FID turns worse
(Karras et al. 2020, fig. 1). Every `trainer.overfit_every` steps D's mean raw score on fixed training
and held-out images is logged with their difference, `d/heldout_gap`; growing, D has learnt these images.

The measurement leaves training untouched: D runs in train mode (as in its steps) under no_grad,
every buffer it would update (BatchNorm's running statistics, spectral norm's vectors) is put back,
and no random number is drawn from torch's generators. Images are not augmented.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import Tensor, nn

from gan.config import TrainConfig
from gan.core.steps import StepContext
from gan.data import EmptySplitError, ImageSet, open_source, take, to_unit_range
from gan.errors import DataError

log = logging.getLogger(__name__)

# Images of each split that D is scored on: enough for a mean score to move by less than the gap it shows.
PROBE_IMAGES = 512
_SUBSET_SEED = 20_200_611  # a generator of its own: the run's random streams are not touched


class OverfitProbe:
    """D's mean score on fixed training and held-out images; see the module docstring."""

    def __init__(
        self,
        train: tuple[Tensor, Optional[Tensor]],
        held_out: tuple[Tensor, Optional[Tensor]],
        batch_size: int,
    ):
        """`train` and `held_out`: (uint8 images (N, C, H, W) on the training device, their labels
        for a conditional D or None); D sees them in chunks of `batch_size`."""
        self.train, self.held_out, self.batch_size = train, held_out, batch_size

    @torch.no_grad()
    def measure(self, D: nn.Module, ctx: StepContext) -> dict[str, float]:
        """{'d/score_train', 'd/score_heldout', 'd/heldout_gap'}: mean raw scores and their difference."""
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
    """The probe for this run, or None when trainer.overfit_every=0 or the held-out split is empty or
    damaged. Here a run first opens the held-out split, so a run that needs it (trainer.final_eval_samples)
    stops on its DataError before it trains."""
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
                "The held-out split cannot be read: %s Training goes on without D's held-out scores "
                "(d/heldout_gap, trainer.overfit_every); evaluate.py measures against this split and will "
                "refuse it until it is fixed.",
                err,
            )
        return None
    if not cfg.trainer.overfit_every:
        return None
    count = min(PROBE_IMAGES, len(train.images), len(held_out))
    count -= count % cfg.model.pack  # D judges packs of model.pack images
    if count < cfg.model.pack:
        return None
    conditional = cfg.model.conditional
    pick = torch.Generator().manual_seed(_SUBSET_SEED)
    subsets = []
    for images, labels in ((train.images, train.labels), (held_out, held_out.labels)):
        index = torch.randperm(len(images), generator=pick)[:count]
        subset = (take(images, index).to(device), labels[index].to(device) if conditional else None)
        subsets.append(subset)
    return OverfitProbe(subsets[0], subsets[1], min(cfg.data.batch_size, count))
