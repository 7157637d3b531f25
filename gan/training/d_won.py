"""Has D won? A D that wins gives D(G(z)) near 0 and r_t near 1, G learns through the flat tail of its sigmoid,
and the samples decay. One log point like that is noise; a window of trainer.d_won_window steps is not."""

import collections
import logging
import math
from typing import Callable, Mapping, Optional

from gan.config import LossName, OnDWon, TrainConfig

log = logging.getLogger(__name__)

FAKE_BELOW = 0.05  # D's mean probability on fakes below which it is winning: sigmoid(-2.9)
RT_ABOVE = 0.9  # ...while it also calls nearly every real image real (r_t = 1: every real logit positive)
FAKE_TAG = "loss/D(G(z))"  # D's mean probability that a fake is real, whatever the loss (losses.mean_scores)
RT_TAG = "train/d_overfit_rt"
WON_TAG = "train/d_won"  # the watch's reading at every log point, 0 until its window is full: 0 or 1
ALARM_TAG = "alarm/D_won"  # 1 at each step the alarm fires, so its card reads that step; sorts before `loss`: it opens
TEXT_TAG = "run/d_won"  # the warning: the Text tab sorts it after the run's command and config


class DWonWatch:
    """`observe` at each log point returns the scalars to log (train/d_won, and alarm/D_won at the step the alarm
    fires: a healthy run never writes it); `on_alarm` is called once per episode."""

    def __init__(self, window_steps: int, log_every: int, on_alarm: Callable[[int, str], None]):
        self.points = max(1, window_steps // log_every)  # log points in a window
        self.window_steps, self.on_alarm = window_steps, on_alarm
        self.recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=self.points)
        self.won = False

    def observe(self, step: int, values: Mapping[str, float]) -> dict[str, float]:
        fake, rt = values.get(FAKE_TAG), values.get(RT_TAG)
        if fake is None or rt is None or not (math.isfinite(fake) and math.isfinite(rt)):
            return {}
        self.recent.append((fake, rt))
        mean_fake, mean_rt = (sum(column) / len(self.recent) for column in zip(*self.recent))
        won = len(self.recent) == self.points and mean_fake < FAKE_BELOW and mean_rt > RT_ABOVE  # a whole window
        fired, self.won = won and not self.won, won
        if fired:
            self.on_alarm(step, self.message(step, mean_fake, mean_rt))
        return {WON_TAG: float(won), **({ALARM_TAG: 1.0} if fired else {})}

    def message(self, step: int, mean_fake: float, mean_rt: float) -> str:
        return (
            f"D has won at step {step}: over the last {self.window_steps} steps its mean probability that "
            f"a fake is real was {mean_fake:.3f} (< {FAKE_BELOW}) and r_t = E[sign(D(x))] {mean_rt:.2f} "
            f"(> {RT_ABOVE}). G learns little from a D this sure, and its samples may decay from here. "
            "The best generator so far is kept in checkpoints/best.pt when trainer.eval_every "
            "is on; docs/results.md, 'Training longer', measures recipes trained past their length."
        )


def d_won_watch(cfg: TrainConfig, on_alarm: Callable[[int, str], None]) -> Optional[DWonWatch]:
    if cfg.trainer.on_d_won == OnDWon.off or cfg.loss.name == LossName.wgan_gp:
        return None
    return DWonWatch(cfg.trainer.d_won_window, cfg.trainer.log_every, on_alarm)
