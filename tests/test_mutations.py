"""Mutation checks: the tests cited as the proof of a technique fail when that technique is removed.

A test of a PyTorch fact on toy code passes whatever gan/ does, so it proves nothing. For each entry of MUTATIONS the
project is copied, the technique removed by an exact text patch (its anchor occurs once, inside the function named),
and the cited tests run where `import gan` is the copy's (the run records each gan module's file): each must fail, as
a failure, not a collection error, and all pass on an unchanged copy. TECHNIQUES says what each technique is for, so
that VARIANTS (other ways to remove it) fail its proofs too; KINDS names what a mutant breaks besides the technique.
They generate docs/proofs.md's tables. Nothing here imports torch (the runs do, in their own processes).

    .venv/bin/python tests/test_mutations.py --write          # regenerate docs/proofs.md
    .venv/bin/python tests/test_mutations.py --variants [ID]  # MUTATIONS and VARIANTS (or those named)
"""

from __future__ import annotations

import ast
import functools
import gc
import json
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from threading import Lock
from typing import Iterator, NamedTuple, Sequence

import pytest
from test_docs import find_definition

ROOT = Path(__file__).resolve().parents[1]
PROOFS_PAGE = ROOT / "docs" / "proofs.md"
TECHNIQUES_FILE = ROOT / "tests" / "test_steps.py"
# test_steps.py's section of toy demonstrations, which never count as a proof of gan/
FACTS_HEADER = "# PyTorch facts (not proofs of this project's code)"

# What the cited tests need in a copy to run as they do here (pyproject.toml: pytest's options)
COPIED = ("gan", "tests", "configs", "scripts", "train.py", "evaluate.py", "pyproject.toml")
# Runs at a time: a run is a few seconds of CPU, and the suite runs on machines of 2 busy cores.
WORKERS = 2


class Mutation(NamedTuple):
    """One technique removed by one text patch (where: `path.py:function` or `:Class.method` holding the anchor;
    replacement "" deletes it), the node ids that must fail, README's technique-table row ("" for a variant)."""

    id: str
    technique: str
    where: str
    anchor: str
    replacement: str
    cited: tuple[str, ...]
    readme: str = ""
    kind: str = ""


STEPS, SAMPLING, EMA, LOOP = "gan/core/steps.py:", "gan/core/sampling.py:", "gan/core/ema.py:", "gan/training/loop.py:"
STATE = "gan/training/state.py:"
# What a mutant breaks, besides the technique itself: the proofs must bind the technique's wiring and
# its side channels too, not only the function that applies it.
KINDS = {
    "": "the technique removed",
    "a": "(a) a config key stops reaching the code it configures",
    "b": "(b) a logged number differs from what it names",
    "c": "(c) isolation broken under a penalty",
    "d": "(d) a checkpoint written on another device",
}
S, E = "tests/test_steps.py::", "tests/test_ema.py::"
# the tests MUTATIONS, VARIANTS and TECHNIQUES cite
D_STEP = S + "test_d_step_leaves_generator_gradients_none"
G_STEP = S + "test_g_step_leaves_discriminator_untouched"
EACH_UPDATE = S + "test_each_update_sees_only_its_own_gradients"
FROZEN_FLAGS = S + "test_frozen_restores_each_flag_even_on_error"
SAME_GRADIENTS = S + "test_summed_and_separate_backward_give_the_same_gradients"
EACH_TERM = S + "test_g_step_logs_each_term_in_separate_mode"
GRAPH_FREED = S + "test_g_step_frees_the_graph_of_g_when_it_returns"
SAMPLE = S + "test_sample_builds_no_graph_and_leaves_generator_untouched"
LATENTS = S + "test_the_loop_makes_each_latent_batch_on_the_device"
BN_STATS = S + "test_evaluation_recomputes_the_batchnorm_statistics_of_the_generator_it_measures"
EMA_GRIDS = E + "test_sample_grids_are_drawn_from_the_ema_generator"
EMA_MOVES = E + "test_the_ema_generator_moves_toward_g_at_each_update"
EMA_WARMS_UP = E + "test_ema_decay_warms_up"
EMA_AVERAGES = E + "test_ema_averages_weights_and_batchnorm_statistics"
EMA_EVERY = E + "test_the_loop_updates_the_ema_every_model_ema_every_steps"
LOSS_KEYS = "tests/test_training.py::test_each_loss_key_reaches_the_steps"
MAP_LOCATION = S + "test_checkpoint_tensors_follow_map_location"
NO_NAN_CHECKPOINT = "tests/test_faults.py::test_an_infinite_learning_rate_stops_before_any_checkpoint"
GRAD_AT_IMAGES = "tests/test_walkthrough.py::test_g_step_keeps_the_gradient_that_reaches_the_fake_images"
SECOND_ORDER = "tests/test_losses.py::test_gradient_penalty_closed_form_and_second_order_gradient"

# fmt: off
MUTATIONS: list[Mutation] = [
    Mutation("detach", "D step on `fake.detach()`", STEPS + "d_step", "fake_logits = D(ctx.augment(fake.detach()), y)",
             "fake_logits = D(ctx.augment(fake), y)", (D_STEP, EACH_UPDATE), readme="D step on `fake.detach()`"),
    Mutation("freeze", "D frozen for the G step", STEPS + "g_step", "with frozen(D):", "with contextlib.nullcontext():",
             (G_STEP, EACH_UPDATE), readme="D frozen with `requires_grad_(False)`"),
    Mutation("release-d", "D's gradients released after D's update", STEPS + "d_step", "release_grads(D)", "pass",
             (D_STEP, EACH_UPDATE), readme="`param.grad = None` after each update"),
    Mutation("release-g", "G's gradients released after G's update", STEPS + "g_step", "release_grads(G)", "pass",
             (G_STEP, EACH_UPDATE), readme="`param.grad = None` after each update"),
    Mutation("eval", "samples drawn in `eval()` mode", SAMPLING + "sample", "with eval_mode(G), torch.no_grad():",
             "with torch.no_grad():", (SAMPLE,), readme="sampling under `eval()` + `no_grad()`"),
    Mutation("no-grad", "samples drawn under `no_grad()`", SAMPLING + "sample", "with eval_mode(G), torch.no_grad():",
             "with eval_mode(G):", (SAMPLE,), readme="sampling under `eval()` + `no_grad()`"),
    Mutation("retain-graph", "`retain_graph=True` in `loss.backward_mode=separate`", STEPS + "backward_terms",
             "backward(retain_graph=not last)", "backward()", (SAME_GRADIENTS, EACH_TERM, GRAPH_FREED),
             readme="`retain_graph=True` is needed where one graph is backpropagated more than once"),
    Mutation("ema-sampler", "samples drawn from the EMA generator", "gan/training/state.py:TrainingState.sampler",
             "return self.G_ema.module if self.G_ema is not None else self.G", "return self.G", (EMA_GRIDS,),
             readme="every sample drawn from the EMA generator"),
    Mutation("latents-on-device", "latents made on the device", LOOP + "train",
             "z = torch.randn(real.size(0), z_dim, device=device)", "z = torch.randn(real.size(0), z_dim).to(device)",
             (LATENTS,), readme="latents made on the device"),
    Mutation("bn-recompute", "BatchNorm statistics recomputed before evaluation",
             "gan/evaluation/pipeline.py:prepare_generator",
             "recomputed = recompute_batchnorm_stats(G, cfg.bn_batches, cfg.batch_size, cfg.seed, device)",
             "recomputed = False", (BN_STATS,), readme="BatchNorm statistics recomputed"),
    Mutation("finite-check", "the finiteness check before each checkpoint", LOOP + "periodic_extras",
             "check_finite_state(state, run.last)", "pass", (NO_NAN_CHECKPOINT,),
             readme="no checkpoint holds a NaN"),
    Mutation("retain-grad", "`retain_grad()` on the fake images", STEPS + "g_step", "fake.retain_grad()", "pass",
             (GRAD_AT_IMAGES,), readme="`retain_grad()` on a non-leaf"),
    Mutation("create-graph", "`create_graph=True` in the gradient penalty", "gan/core/losses.py:gradient_penalty",
             "(grad,) = torch.autograd.grad(critic(interpolates).sum(), interpolates, create_graph=True)",
             "(grad,) = torch.autograd.grad(critic(interpolates).sum(), interpolates, create_graph=False)",
             (SECOND_ORDER,), readme="`create_graph=True`"),
    Mutation("ema-update", "the EMA generator averages G's weights", LOOP + "train",
             "state.G_ema.update_parameters(state.G)", "pass", (EMA_MOVES,), readme="EMA of G's weights"),
    # (a)-(d): the technique's wiring and side channels, each with the readme row of its technique
    Mutation("ema-every-cadence", "`model.ema_every` reaches the loop's EMA", LOOP + "train",
             "state.step % cfg.model.ema_every == 0", "state.step % 1 == 0", (EMA_EVERY,),
             readme="EMA of G's weights", kind="a"),
    Mutation("ema-every-decay", "`model.ema_every` reaches the EMA's decay", STATE + "build_state",
             "images_per_step, model.ema_every)", "images_per_step)", (EMA_EVERY,),
             readme="EMA of G's weights", kind="a"),
    Mutation("backward-mode-key", "`loss.backward_mode` reaches the G step", STATE + "build_step_context",
             ", backward_mode=loss.backward_mode", "", (LOSS_KEYS,),
             readme="`retain_graph=True` is needed where one graph is backpropagated more than once", kind="a"),
    Mutation("penalty-keys", "`loss.gradient_penalty` and `loss.r1` reach the D step", STATE + "build_step_context",
             "penalties=penalties, ", "", (LOSS_KEYS,), readme="`create_graph=True`", kind="a"),
    Mutation("term-norm-accumulated", "separate mode's `grad_norm/g_NAME` is term NAME's own", STEPS + "backward_terms",
             "        before = after\n", "", (EACH_TERM,),
             readme="`retain_graph=True` is needed where one graph is backpropagated more than once", kind="b"),
    Mutation("grad-norm-images-of-the-batch", "`grad_norm/images` is the mean norm per image", STEPS + "g_step",
             "fake.grad.flatten(1).norm(dim=1).mean()", "fake.grad.norm()", (GRAD_AT_IMAGES,),
             readme="`retain_grad()` on a non-leaf", kind="b"),
    Mutation("gp-fake-attached", "the gradient penalty's interpolates on `fake.detach()`", STEPS + "d_step",
             "real, fake.detach())", "real, fake)", (D_STEP,), readme="D step on `fake.detach()`", kind="c"),
    Mutation("map-location-after-load", "`map_location` for a checkpoint saved on a GPU",
             "gan/checkpoint.py:load_checkpoint", "torch.load(file, map_location=map_location, weights_only=True)",
             "torch.utils._pytree.tree_map(lambda t: t.to(map_location) if isinstance(t, torch.Tensor) else t, "
             "torch.load(file, weights_only=True))", (MAP_LOCATION,),
             readme="a checkpoint's tensors loaded where they are wanted", kind="d"),
]

# The same techniques removed other ways (most keep the line a check of presence would look for);
# run by `python tests/test_mutations.py --variants`.
VARIANTS: list[Mutation] = [
    Mutation("detach-as-clone", "D step on `fake.detach()`", STEPS + "d_step", "D(ctx.augment(fake.detach()), y)",
             "D(ctx.augment(fake.clone()), y)", (D_STEP, EACH_UPDATE)),
    Mutation("frozen-freezes-nothing", "D frozen for the G step", STEPS + "frozen", "module.requires_grad_(False)",
             "pass", (G_STEP, EACH_UPDATE, FROZEN_FLAGS)),
    Mutation("release-d-deleted", "D's gradients released after D's update", STEPS + "d_step", "    release_grads(D)\n",
             "", (D_STEP, EACH_UPDATE)),
    Mutation("release-g-deleted", "G's gradients released after G's update", STEPS + "g_step", "    release_grads(G)\n",
             "", (G_STEP, EACH_UPDATE)),
    Mutation("release-zeroes", "gradients released (`None`), not zeroed", STEPS + "release_grads",
             "        p.grad = None", "        p.grad = None if p.grad is None else p.grad.zero_()",
             (D_STEP, G_STEP)),
    Mutation("eval-mode-no-eval", "samples drawn in `eval()` mode", SAMPLING + "eval_mode", "    module.eval()",
             "    pass", (SAMPLE,)),
    Mutation("enable-grad", "samples drawn under `no_grad()`", SAMPLING + "sample",
             "with eval_mode(G), torch.no_grad():", "with eval_mode(G), torch.enable_grad():", (SAMPLE,)),
    Mutation("retain-graph-false", "`retain_graph=True` in `loss.backward_mode=separate`", STEPS + "backward_terms",
             "retain_graph=not last", "retain_graph=False", (SAME_GRADIENTS, EACH_TERM, GRAPH_FREED)),
    Mutation("loop-samples-raw-g", "samples drawn from the EMA generator", LOOP + "periodic_extras",
             "sample(state.sampler, state.fixed_z, state.fixed_y)", "sample(state.G, state.fixed_z, state.fixed_y)",
             (EMA_GRIDS,)),
    Mutation("update-bn-skipped", "BatchNorm statistics recomputed before evaluation",
             "gan/evaluation/pipeline.py:recompute_batchnorm_stats", "update_bn(inputs, G, device)", "pass",
             (BN_STATS,)),
    Mutation("finite-check-logs", "the finiteness check before each checkpoint",
             "gan/training/faults.py:check_finite_state", "raise NonFiniteWeightsError(", "log.error(",
             (NO_NAN_CHECKPOINT,)),
    Mutation("d-fake-logits-no-grad", "D step on `fake.detach()`", STEPS + "d_step",
             "fake_logits = D(ctx.augment(fake.detach()), y)\n",
             "with torch.no_grad():\n            fake_logits = D(ctx.augment(fake.detach()), y)\n", (D_STEP,)),
    Mutation("d-fake-logits-detached", "D step on `fake.detach()`", STEPS + "d_step",
             "fake_logits = D(ctx.augment(fake.detach()), y)",
             "fake_logits = D(ctx.augment(fake.detach()), y).detach()", (D_STEP,)),
    Mutation("d-fake-term-detached", "D step on `fake.detach()`", STEPS + "d_step",
             "terms = {\"adv\": ctx.loss.d(real_logits, fake_logits)}",
             "terms = {\"adv\": ctx.loss.d(real_logits, fake_logits.detach())}", (D_STEP,)),
    Mutation("d-fake-term-dropped", "D step on `fake.detach()`", "gan/core/losses.py:d_loss_bce",
             "    return real + fake\n", "    return real\n", (D_STEP,)),
    Mutation("d-real-logits-detached", "D step on `fake.detach()`", STEPS + "d_step",
             "real_logits, real_features = D(ctx.augment(real), y, with_features=True)",
             "real_logits, real_features = (t.detach() for t in D(ctx.augment(real), y, with_features=True))",
             (D_STEP,)),
    Mutation("frozen-clears-after", "D frozen for the G step", STEPS + "frozen",
             "    module.requires_grad_(False)\n    try:\n        yield module\n    finally:\n",
             "    try:\n        yield module\n    finally:\n        module.zero_grad(set_to_none=True)\n",
             (G_STEP, FROZEN_FLAGS)),
    Mutation("release-zero-grad-d", "D's gradients released after D's update", STEPS + "d_step", "release_grads(D)",
             "opt_d.zero_grad(set_to_none=False)", (D_STEP, EACH_UPDATE)),
    Mutation("ema-decay-one", "the EMA generator averages G's weights", EMA + "ema_with_warmup", ".clamp(max=decay)",
             ".clamp(min=1.0)", (EMA_MOVES, EMA_WARMS_UP, EMA_AVERAGES)),
    Mutation("ema-update-copies-nothing", "the EMA generator averages G's weights", EMA + "_ema_update",
             "torch._foreach_lerp_(averaged, current, 1 - decay)", "pass", (EMA_MOVES, EMA_WARMS_UP, EMA_AVERAGES)),
    Mutation("ema-averages-itself", "the EMA generator averages G's weights", LOOP + "train",
             "state.G_ema.update_parameters(state.G)", "state.G_ema.update_parameters(state.G_ema.module)",
             (EMA_MOVES,)),
    Mutation("ema-copies-g", "the EMA generator averages G's weights", EMA + "_ema_update",
             "torch._foreach_lerp_(averaged, current, 1 - decay)", "torch._foreach_copy_(averaged, current)",
             (EMA_MOVES, EMA_WARMS_UP, EMA_AVERAGES, EMA_GRIDS)),
    Mutation("ema-weights-swapped", "the EMA generator averages G's weights", EMA + "_ema_update",
             "torch._foreach_lerp_(averaged, current, 1 - decay)", "torch._foreach_lerp_(averaged, current, decay)",
             (EMA_WARMS_UP, EMA_GRIDS)),
    Mutation("ema-no-buffers", "the EMA generator averages G's weights", EMA + "build_ema",
             "multi_avg_fn=update, use_buffers=True", "multi_avg_fn=update, use_buffers=False",
             (EMA_MOVES, EMA_AVERAGES)),
    Mutation("g-retain-graph-summed", "G's graph freed when the G step returns", STEPS + "backward_terms",
             "ctx.scaler.scale(sum(terms.values())).backward()",
             "ctx.scaler.scale(sum(terms.values())).backward(retain_graph=True)", (GRAPH_FREED,)),
    Mutation("g-retain-graph-every-term", "G's graph freed when the G step returns", STEPS + "backward_terms",
             "backward(retain_graph=not last)", "backward(retain_graph=True)", (GRAPH_FREED,)),
    Mutation("g-fake-kept-on-g", "G's graph freed when the G step returns", STEPS + "g_step",
             "    fake.retain_grad()\n", "    fake.retain_grad()\n    G.last_fake = fake\n", (GRAPH_FREED,)),
    Mutation("g-loss-returned-with-graph", "G's graph freed when the G step returns", STEPS + "g_step",
             "loss_g = sum(terms.values()).detach()", "loss_g = sum(terms.values())", (GRAPH_FREED,)),
    Mutation("g-scores-with-graph", "G's graph freed when the G step returns", STEPS + "g_step",
             "after = ctx.loss.scores(fake_logits.detach(), fake_logits.detach())",
             "after = ctx.loss.scores(fake_logits, fake_logits)", (GRAPH_FREED,)),
    Mutation("sample-leaves-eval-mode", "samples drawn in `eval()` mode", SAMPLING + "eval_mode",
             "module.train(was_training)", "module.train()", (SAMPLE,)),
    Mutation("sample-detached-not-no-grad", "samples drawn under `no_grad()`", SAMPLING + "sample",
             "    with eval_mode(G), torch.no_grad():\n        return G(z) if y is None else G(z, y)\n",
             "    with eval_mode(G):\n        return (G(z) if y is None else G(z, y)).detach()\n", (SAMPLE,)),
    Mutation("latents-on-cpu-then-moved", "latents made on the device", LOOP + "train",
             "z = torch.randn(real.size(0), z_dim, device=device)",
             "z = torch.randn(real.size(0), z_dim, device=\"cpu\").to(device)", (LATENTS,)),
]
# fmt: on


class Technique(NamedTuple):
    """One row of docs/proofs.md's table of techniques: what each is for, which its proofs check."""

    technique: str
    purpose: str
    where: str
    proofs: tuple[str, ...]


# fmt: off
TECHNIQUES: list[Technique] = [
    Technique("D step on `fake.detach()`",
              "D learns from the real and the fake images: the gradient its update sees is the whole D loss's, with a "
              "nonzero part through each; G gets no gradient from D's loss, with every loss and penalty",
              "`gan/core/steps.py:d_step`", (D_STEP, EACH_UPDATE)),
    Technique("D frozen with `requires_grad_(False)` for the G step, restored after",
              "G's update sees exactly the G loss's gradient through D, and autograd computes no gradient for any of "
              "D's weights (none to clear, none left for D's next update); each flag restored, even on error",
              "`gan/core/steps.py:g_step`, `gan/core/steps.py:frozen`",
              (G_STEP, EACH_UPDATE, FROZEN_FLAGS)),
    Technique("`param.grad = None` after each update, in both steps",
              "each update sees the gradients of its own step only: this loop clears after each update, not before "
              "each backward; `None`, not zero: no memory held and no zeros written between the steps, and a "
              "parameter its step gave no gradient shows `None`, not a zero that looks computed",
              "`gan/core/steps.py:release_grads`, in `d_step` and `g_step`",
              (D_STEP, EACH_UPDATE, G_STEP)),
    Technique("multi-loss G objective; `retain_graph=True` only where one graph is backpropagated more than once",
              "one summed `backward()` and one per term give the same gradients; G's graph (every tensor saved for "
              "backward) is freed when the G step returns, though the caller still holds `fake`, and nothing the step "
              "returns or keeps refers to it; each term's logged gradient norm is its own; `loss.backward_mode` "
              "reaches the G step",
              "`gan/core/steps.py:backward_terms`, `gan/core/steps.py:g_step`",
              (SAME_GRADIENTS, EACH_TERM, GRAPH_FREED, LOSS_KEYS)),
    Technique("`retain_grad()` on the fake images",
              "the gradient at the fake images is kept, and is exactly d loss_G / d fake; `grad_norm/images` logs its "
              "mean norm per image",
              "`gan/core/steps.py:g_step`", (GRAD_AT_IMAGES,)),
    Technique("`create_graph=True` in the gradient penalty",
              "the penalty's own gradient reaches D's weights (a second-order backward); `loss.gradient_penalty` and "
              "`loss.r1` reach the D step",
              "`gan/core/losses.py:gradient_penalty`", (SECOND_ORDER, LOSS_KEYS)),
    Technique("sampling under `eval()` + `no_grad()`, previous mode restored",
              "drawing images disturbs nothing: no tensor saved for a backward, no graph on the images, G's weights, "
              "BatchNorm statistics and mode (train or eval) as they were; each image depends on its own latent alone",
              "`gan/core/sampling.py:sample`, `gan/core/sampling.py:eval_mode`", (SAMPLE,)),
    Technique("EMA of G's weights and BatchNorm statistics; every sample drawn from the EMA generator",
              "in a training run each EMA update moves every weight and statistic part of the way toward G's, by one "
              "fraction 1 - decay strictly between 0 and 1; the decay follows its schedule; `model.ema_every` sets "
              "the loop's cadence and decay; the sample grids are the EMA's, not G's",
              "`gan/core/ema.py:build_ema`, `gan/training/loop.py:train`, "
              "`gan/training/state.py:TrainingState.sampler`",
              (EMA_MOVES, EMA_WARMS_UP, EMA_AVERAGES, EMA_EVERY, EMA_GRIDS)),
    Technique("latents made on the device",
              "no host-to-device copy per step: `torch.randn` is given the training device and the latent it makes is "
              "never moved or copied",
              "`gan/training/loop.py:train`", (LATENTS,)),
    Technique("a checkpoint's tensors loaded where they are wanted (`map_location`); an unavailable "
              "`trainer.device=cuda` refused",
              "a checkpoint's tensors land on the device asked for, whatever device saved them; asking for a GPU that "
              "is not there is refused naming the key",
              "`gan/checkpoint.py:load_checkpoint`, `gan/device.py:resolve_device`",
              (MAP_LOCATION, S + "test_unavailable_cuda_is_refused_naming_the_key")),
    Technique("D returns logits; with-logits losses; N(0, 0.02) init",
              "the losses take logits, so they equal sigmoid + BCELoss where that is finite and stay exact where "
              "sigmoid saturates; G's convolutions start from DCGAN's N(0, 0.02), its BatchNorm weights near 1 and "
              "biases 0",
              "`gan/core/models.py:Discriminator`, `gan/core/losses.py`, `gan/core/models.py:dcgan_init_`",
              ("tests/test_models.py::test_discriminator_returns_logits_not_probabilities",
               "tests/test_models.py::test_dcgan_init",
               "tests/test_losses.py::test_bce_matches_sigmoid_plus_bceloss",
               "tests/test_losses.py::test_with_logits_form_is_exact_where_sigmoid_saturates")),
    Technique("BatchNorm statistics recomputed for the generator `evaluate.py` measures",
              "the measured generator normalises with statistics of its own weights, not the EMA's averages of past "
              "statistics",
              "`gan/evaluation/pipeline.py:prepare_generator`, `gan/evaluation/pipeline.py:recompute_batchnorm_stats`",
              (BN_STATS,)),
    Technique("the finiteness check before each checkpoint",
              "no checkpoint holds a NaN: a run whose weights became infinite stops before writing one",
              "`gan/training/faults.py:check_finite_state`, in `gan/training/loop.py:periodic_extras`",
              (NO_NAN_CHECKPOINT,)),
]
# fmt: on


# applying a mutation --------------------------------------------------------------------------------


# The mutants are patched in a thread pool, and CPython 3.11's ast.parse keeps one recursion counter for every
# thread: two parses at once failed here with "AST constructor recursion depth mismatch". One parse at a time.
PARSING = Lock()


def parse(source: str) -> ast.Module:
    with PARSING:
        return ast.parse(source)


def patch(source: str, mutation: Mutation) -> str:
    """`source` with the anchor replaced; AssertionError unless it occurs once, inside the def (or class) named."""
    file, function = mutation.where.split(":")
    count = source.count(mutation.anchor)
    assert count == 1, f"{mutation.id}: the anchor occurs {count} times in {file}: {mutation.anchor!r}"
    node: ast.AST = parse(source)
    for part in function.split("."):  # `name` or `Class.method`, at the top of the module
        node = next((n for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        assert node is not None, f"{mutation.id}: {file} defines no {function}"
    line = source[: source.index(mutation.anchor)].count("\n") + 1
    assert node.lineno <= line <= node.end_lineno, f"{mutation.id}: the anchor is outside {mutation.where}"
    mutated = source.replace(mutation.anchor, mutation.replacement)
    parse(mutated)  # a mutant that does not even parse would prove nothing
    return mutated


def copy_project(into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, into / name)
    return into


class Run(NamedTuple):
    """The outcome of the cited tests on one copy; origins: module -> file of every gan module imported."""

    copy: Path
    returncode: int
    output: str
    origins: dict[str, str | None]


# Each run is a process of its own, forked from a server that imported the third-party modules the
# cited tests import, once (multiprocessing's forkserver): `python -m pytest` per copy would spend
# most of its time importing them again. Never gan: each run imports the copy's. Of hydra, not its
# pytest plugin (hydra.extra.pytest_plugin), whose asserts pytest rewrites as it loads it.
PRELOAD = [
    *("torch", "torchvision", "numpy", "PIL.Image", "omegaconf", "torch.utils.tensorboard", "tqdm", "pytest"),
    *("hydra.compose", "hydra.utils", "torchmetrics", "torch_fidelity", "scipy.linalg", "matplotlib.pyplot"),
]


@functools.cache
def fork_server() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def pytest_in_copy(copy: str, args: list[str], log: str) -> None:
    """In a forked process: `python -m pytest ARGS` in the copy with PYTHONPATH=copy, output into `log`; then
    the file of every gan module imported into `_mutation_origin.json`, to show the copy, not this checkout, ran."""
    gc.freeze()  # what the server preloaded is never garbage: pytest's gc.collect() calls skip it
    os.chdir(copy)
    # this checkout off the path and the copy first: `import gan` must find the copy's package
    own = {ROOT.resolve(), (ROOT / "tests").resolve()}
    sys.path[:] = [copy, *(p for p in sys.path if p not in ("", ".") and Path(p).resolve() not in own)]
    os.environ.update(PYTHONPATH=copy, PYTHONDONTWRITEBYTECODE="1")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # a quicker start: xdist's and hydra's plugins unused here
    sys.dont_write_bytecode = True
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (1, 2):  # stdout, stderr
        os.dup2(out, stream)
    code = int(pytest.main(args))
    files = {name: getattr(m, "__file__", None) for name, m in list(sys.modules.items()) if name.split(".")[0] == "gan"}
    Path(copy, "_mutation_origin.json").write_text(json.dumps(files), encoding="utf-8")
    sys.exit(code)


def run_tests(copy: Path, node_ids: Sequence[str], timeout: float = 300) -> Run:
    log, origin = copy / "_mutation_log.txt", copy / "_mutation_origin.json"
    args = ["-q", "-rA", "-p", "no:cacheprovider", *node_ids]  # -rA: one summary line per test with its outcome
    process = fork_server().Process(target=pytest_in_copy, args=(str(copy), args, str(log)))
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
    origins = json.loads(origin.read_text(encoding="utf-8")) if origin.exists() else {}
    output = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    return Run(copy, process.exitcode, output, origins)


def run_mutant(mutation: Mutation, where: Path) -> Run:
    target = copy_project(where) / mutation.where.split(":")[0]
    target.write_text(patch(target.read_text(encoding="utf-8"), mutation), encoding="utf-8")
    return run_tests(where, mutation.cited)


def run_problems(run: Run, cited: Sequence[str], outcome: str, module: str | None = None) -> list[str]:
    """Why the run does not show every cited test with `outcome` ([] when it does): FAILED on a mutant (pytest
    exits 1; 2 is a collection error or an interruption), PASSED on the unchanged copy (pytest exits 0); a gan
    module imported from outside the copy, or `module` (the mutated one) never imported, means it tested no copy."""
    problems = [
        f"{name} was imported from {file}, not from the copy"
        for name, file in run.origins.items()
        if file is not None and not Path(file).resolve().is_relative_to(run.copy.resolve())
    ]
    if not run.origins:
        problems.append("the run recorded no gan module at all")
    elif module is not None and module not in run.origins:
        problems.append(f"{module} was never imported")
    if run.returncode != (code := 1 if outcome == "FAILED" else 0):
        problems.append(f"pytest exited {run.returncode}, not {code}")
    found = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", run.output, flags=re.MULTILINE)  # pytest's -rA summary
    outcomes = {node: result for result, node in found}
    return problems + [
        f"{node}: {outcomes.get(node, 'did not run')}, not {outcome}" for node in cited if outcomes.get(node) != outcome
    ]


def mutant_problems(mutation: Mutation, run: Run) -> list[str]:
    module = mutation.where.split(":")[0].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return run_problems(run, mutation.cited, "FAILED", module)


def all_cited(mutations: Sequence[Mutation]) -> list[str]:
    return sorted({node for m in mutations for node in m.cited})


def pytorch_facts() -> set[str]:
    """Node ids of test_steps.py's PyTorch facts: the tests defined below FACTS_HEADER."""
    source = TECHNIQUES_FILE.read_text(encoding="utf-8")
    header = next(i for i, line in enumerate(source.splitlines(), 1) if line.startswith(FACTS_HEADER))
    return {
        f"tests/{TECHNIQUES_FILE.name}::{node.name}"
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and node.lineno > header
    }


# docs/proofs.md ------------------------------------------------------------------------------------


def shown(code: str) -> str:
    """A patch's side as a code span of one line (its lines joined by ↵), or `(deleted)`."""
    code = " ↵ ".join(line.strip() for line in code.strip().splitlines())
    return f"`{code}`" if code else "(deleted)"


def cells(*items: str) -> str:
    return "| " + " | ".join(items) + " |"


def table(mutations: Sequence[Mutation], caught: str) -> list[str]:
    rows = [cells("technique", "what breaks", "mutation (file: what is removed)", "cited tests (each must fail)",
                  "caught"), "|---|---|---|---|---|"]  # fmt: skip
    for m in mutations:
        cited, change = ", ".join(f"`{node}`" for node in m.cited), f"{shown(m.anchor)} → {shown(m.replacement)}"
        rows.append(cells(m.technique, KINDS[m.kind], f"`{m.where}`: {change}", cited, caught))
    return rows


TABLES = {
    "purpose": lambda: (
        [cells("technique", "what it is for, which its proofs check", "where", "proven by"), "|---|---|---|---|"]
        + [cells(t.technique, t.purpose, t.where, ", ".join(f"`{n}`" for n in t.proofs)) for t in TECHNIQUES]
    ),
    "checked": lambda: table(MUTATIONS, "yes"),
    "variants": lambda: table(VARIANTS, "by hand (`--variants`)"),
}


def proofs_page(page: str | None = None) -> str:
    """docs/proofs.md (or `page`) with each table between `<!-- table:NAME -->` and `<!-- end -->` generated anew."""
    page = PROOFS_PAGE.read_text(encoding="utf-8") if page is None else page
    fill = lambda found: f"{found[1]}\n" + "\n".join(TABLES[found[2]]()) + "\n<!-- end -->"  # noqa: E731
    return re.sub(r"(<!-- table:(\w+) -->)\n.*?<!-- end -->", fill, page, flags=re.DOTALL)


# the checks ---------------------------------------------------------------------------------------


def start_runs(pool: ThreadPoolExecutor, mutations: Sequence[Mutation], cited: list[str], folder) -> dict[str, Future]:
    """On `pool`: an unchanged copy running `cited` ("original") and each mutant, each in its own `folder(id)`."""
    original = folder("original")
    runs = {"original": pool.submit(lambda: run_tests(copy_project(original), cited))}
    return runs | {m.id: pool.submit(run_mutant, m, folder(m.id)) for m in mutations}


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    """The runs this session's tests of this module ask for: each selected mutant, and every cited test unchanged."""
    mine = [item for item in request.session.items if item.module is request.module and hasattr(item, "callspec")]
    selected = [item.callspec.params["mutation"] for item in mine if "mutation" in item.callspec.params]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        yield start_runs(pool, selected, all_cited(MUTATIONS), tmp_path_factory.mktemp)


def test_the_cited_tests_pass_on_an_unchanged_copy(runs):
    run = runs["original"].result()
    problems = run_problems(run, all_cited(MUTATIONS), "PASSED")
    assert not problems, "\n".join(problems) + "\n" + run.output[-3000:]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.id)
def test_removing_the_technique_fails_its_cited_tests(mutation, runs):
    run = runs[mutation.id].result()
    problems, change = (
        mutant_problems(mutation, run),
        f"{mutation.where}: {mutation.anchor!r} -> {mutation.replacement!r}",
    )
    assert not problems, "\n".join([change, *problems, run.output[-3000:]])


def test_every_anchor_is_found_once_inside_its_function_and_each_id_is_its_own():
    ids = [m.id for m in [*MUTATIONS, *VARIANTS]]  # test ids, and the keys of the runs
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)
    for mutation in [*MUTATIONS, *VARIANTS]:  # checked without running anything, so a moved line is named at once
        patch((ROOT / mutation.where.split(":")[0]).read_text(encoding="utf-8"), mutation)


def test_every_cited_test_is_a_proof_of_the_purpose_table_exists_and_is_no_pytorch_fact():
    proofs, facts = {node for technique in TECHNIQUES for node in technique.proofs}, pytorch_facts()
    assert facts, f"no test found below {FACTS_HEADER!r} in {TECHNIQUES_FILE.name}"
    assert not set(all_cited([*MUTATIONS, *VARIANTS])) - proofs, "cited but in no row of TECHNIQUES"
    assert not proofs & facts, f"a PyTorch fact in TECHNIQUES: {sorted(proofs & facts)}"
    for node in proofs:
        file, name = node.split("::")
        assert isinstance(find_definition(ROOT / file, name), ast.FunctionDef), f"{node} is not defined"


def test_a_patch_that_misses_is_refused():
    source = "def f(x):\n    return x.detach()\n\n\ndef g(x):\n    return x.detach()\n"
    with pytest.raises(AssertionError, match="occurs 2 times"):
        patch(source, Mutation("m", "t", "a.py:f", "x.detach()", "x", ()))
    with pytest.raises(AssertionError, match="outside"):
        patch(source, Mutation("m", "t", "a.py:g", "def f(x):", "def f(y):", ()))
    once = Mutation("m", "t", "a.py:f", "    return x.detach()\n\n\ndef g", "    return x\n\n\ndef g", ())
    assert patch(source, once).startswith("def f(x):\n    return x\n")


# command line ---------------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    if "--write" in argv:
        PROOFS_PAGE.write_text(proofs_page(), encoding="utf-8")
        print(f"wrote {PROOFS_PAGE.relative_to(ROOT)}")
        return 0
    if "--variants" not in argv:
        print(__doc__)
        return 2
    chosen = set(argv[argv.index("--variants") + 1 :])  # ids, or none for all
    mutations = [m for m in [*MUTATIONS, *VARIANTS] if not chosen or m.id in chosen]
    where = Path(tempfile.mkdtemp())
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        runs = start_runs(pool, mutations, all_cited(mutations), where.joinpath)
        problems = {"original": run_problems(runs["original"].result(), all_cited(mutations), "PASSED")}
        print(f"{'original':24} {'; '.join(problems['original']) or 'every cited test passed'}")
        for m in mutations:
            run = runs[m.id].result()
            problems[m.id] = mutant_problems(m, run)
            print(f"{m.id:24} {'NOT CAUGHT: ' + '; '.join(problems[m.id]) if problems[m.id] else 'caught'}")
            for line in re.findall(r"^FAILED .*$", run.output, flags=re.MULTILINE):
                print(f"    {line[:160]}")
    shutil.rmtree(where)
    return 1 if any(problems.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
