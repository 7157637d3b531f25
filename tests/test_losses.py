"""gan/core/losses.py: the losses' and penalties' known values, and their agreement with the textbook formulas."""

import math

import pytest
import torch
from torch import nn

from gan.config import LossName
from gan.core import losses as L

ZERO = torch.zeros(8)  # D(x) = sigmoid(0) = 1/2 everywhere
SIGMOID_2 = 1 / (1 + math.exp(-2.0))
F = torch.randn(16, 8, 4, 4)  # features of 16 samples


# one-sided label smoothing: the real target 0.9, the fake one still 0
SMOOTHED = -(0.9 * math.log(SIGMOID_2) + 0.1 * math.log(1 - SIGMOID_2)) - math.log(1 - 1 / (1 + math.exp(3.0)))
KNOWN = {
    "bce-d": (lambda: L.d_loss_bce(ZERO, ZERO), 2 * math.log(2)),
    "bce-g": (lambda: L.g_loss_bce(ZERO), math.log(2)),
    "hinge-d": (lambda: L.d_loss_hinge(ZERO, ZERO), 2.0),
    "hinge-g": (lambda: L.g_loss_hinge(ZERO), 0.0),
    "hinge-confident": (lambda: L.d_loss_hinge(torch.full((4,), 2.0), torch.full((4,), -2.0)), 0.0),  # and right: 0
    "label-smoothing": (lambda: L.d_loss_bce(torch.full((4,), 2.0), torch.full((4,), -3.0), real_label=0.9), SMOOTHED),
    "fm-same": (lambda: L.feature_matching(F, F[torch.randperm(16)]), 0.0),  # the same mean feature
    "fm-shifted": (lambda: L.feature_matching(F, F + 1), 1.0),
}


@pytest.mark.parametrize("loss, expected", KNOWN.values(), ids=KNOWN)
def test_known_values(loss, expected):
    assert loss().item() == pytest.approx(expected, rel=1e-6, abs=1e-10)


def test_bce_matches_sigmoid_plus_bceloss():
    real, fake = torch.randn(64) * 3, torch.randn(64) * 3
    bce = nn.BCELoss()  # the canonical example's form: Sigmoid in D, then BCELoss
    expected_d = bce(torch.sigmoid(real), torch.ones(64)) + bce(torch.sigmoid(fake), torch.zeros(64))
    expected_g = bce(torch.sigmoid(fake), torch.ones(64))
    assert torch.allclose(L.d_loss_bce(real, fake), expected_d, atol=1e-6)
    assert torch.allclose(L.g_loss_bce(fake), expected_g, atol=1e-6)


def test_with_logits_form_is_exact_where_sigmoid_saturates():
    logits = torch.tensor([-120.0])  # sigmoid underflows to 0 in float32
    # -log(sigmoid(-120)) = 120 exactly; Sigmoid + BCELoss clamps log(0) to -100 and reports 100.
    assert L.g_loss_bce(logits).item() == pytest.approx(120.0)
    assert nn.BCELoss()(torch.sigmoid(logits), torch.ones(1)).item() == pytest.approx(100.0)


def test_every_loss_is_registered_with_the_config_choices():
    assert set(L.LOSSES) == {name.value for name in LossName}


def test_gradient_penalty_closed_form_and_second_order_gradient():
    w = nn.Parameter(torch.full((1, 4, 4), 0.5))  # ||w|| = 0.5 * 4 = 2

    def critic(x):  # D(x) = <w, x>: its input gradient is w for every sample, so the penalties have closed forms
        return (x.flatten(1) * w.flatten()).sum(1)

    penalty = L.gradient_penalty(critic, torch.randn(8, 1, 4, 4), torch.randn(8, 1, 4, 4))
    assert penalty.item() == pytest.approx((2.0 - 1.0) ** 2)
    penalty.backward()  # reaches the weights only because the input gradient kept its graph
    # d/dw (||w|| - 1)^2 = 2 (||w|| - 1) w / ||w||
    torch.testing.assert_close(w.grad, 2 * (2.0 - 1.0) * w.detach() / 2.0)
    real = torch.randn(8, 1, 4, 4, requires_grad=True)
    assert L.r1_penalty(critic(real), real).item() == pytest.approx(4.0)  # R1's closed form: ||w||^2
