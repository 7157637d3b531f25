"""Unit tier: the losses' known values and their agreement with the textbook formulas."""

import math

import pytest
import torch
from torch import nn

from gan.core.losses import LOSSES, d_loss_bce, d_loss_hinge, feature_matching, g_loss_bce, g_loss_hinge


def test_known_values_at_zero_logits():
    zero = torch.zeros(8)  # D(x) = sigmoid(0) = 1/2 everywhere
    assert d_loss_bce(zero, zero).item() == pytest.approx(2 * math.log(2))
    assert g_loss_bce(zero).item() == pytest.approx(math.log(2))
    assert d_loss_hinge(zero, zero).item() == pytest.approx(2.0)
    assert g_loss_hinge(zero).item() == pytest.approx(0.0)


def test_bce_matches_sigmoid_plus_bceloss():
    real, fake = torch.randn(64) * 3, torch.randn(64) * 3
    bce = nn.BCELoss()  # the canonical example's form: Sigmoid in D, then BCELoss
    expected_d = bce(torch.sigmoid(real), torch.ones(64)) + bce(torch.sigmoid(fake), torch.zeros(64))
    expected_g = bce(torch.sigmoid(fake), torch.ones(64))
    assert torch.allclose(d_loss_bce(real, fake), expected_d, atol=1e-6)
    assert torch.allclose(g_loss_bce(fake), expected_g, atol=1e-6)


def test_with_logits_form_is_exact_where_sigmoid_saturates():
    logits = torch.tensor([-120.0])  # sigmoid underflows to 0 in float32
    # -log(sigmoid(-120)) = 120 exactly; Sigmoid + BCELoss clamps log(0) to -100 and reports 100.
    assert g_loss_bce(logits).item() == pytest.approx(120.0)
    assert nn.BCELoss()(torch.sigmoid(logits), torch.ones(1)).item() == pytest.approx(100.0)


def test_hinge_ignores_confident_correct_answers():
    assert d_loss_hinge(torch.full((4,), 2.0), torch.full((4,), -2.0)).item() == 0.0


def test_feature_matching():
    f = torch.randn(16, 8, 4, 4)
    assert feature_matching(f, f[torch.randperm(16)]).item() == pytest.approx(0.0, abs=1e-10)  # same mean
    assert feature_matching(f, f + 1).item() == pytest.approx(1.0)


def test_every_loss_is_registered_with_the_config_choices():
    from gan.config import LossName

    assert set(LOSSES) == {name.value for name in LossName}
