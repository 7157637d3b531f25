"""evaluate.py on what train.py wrote, sampling, interpolation, and the exported generators against the eager one."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIG_DIR, DEVICE, ROOT, output_of, run_evaluate, snapshot, tiny_checkpoint
from hydra import compose, initialize_config_dir
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_checkpoints import run_until
from test_distributed import finish

from gan.checkpoint import load_checkpoint
from gan.config import ConfigError, EvaluateConfig, ExportFormat, FeatureSpace, MetricsConfig, validate_and_check
from gan.device import environment as device_environment
from gan.errors import CheckpointError, MetricsError
from gan.evaluation import pipeline as X
from gan.evaluation.pipeline import build_generator, evaluate, recompute_batchnorm_stats
from gan.run import Run

MEASURES = ["fid", "kid_mean", "kid_std", "precision", "recall", "density", "coverage"]
REQUIRED_KEYS = {*MEASURES, "classes_covered", "class_kl", "num_samples", "num_real", "real_split", "feature_space"}
# 200 samples; the metrics classifier trains in a few seconds on 10,000 digits, whatever the run drew
TINY_EVAL = ["num_samples=200", "threads=1", "device=cpu", "metrics.kid_subsets=10", "bn_batches=2"]


@pytest.fixture(scope="module")
def evaluated(tiny_run, classifier_cache, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """`evaluate.py checkpoint=<run dir>` on the session's tiny run, every optional output on; the run untouched."""
    eval_dir, before = tmp_path_factory.mktemp("eval") / "eval", snapshot(tiny_run)
    outputs = ["export=both", "save_samples=npz", f"hydra.run.dir={eval_dir}"]
    result = run_evaluate(f"checkpoint={tiny_run}", f"data.root={classifier_cache.parent}", *TINY_EVAL, *outputs)
    assert result.returncode == 0, result.stderr[-3000:]
    assert snapshot(tiny_run) == before
    return eval_dir, result


def test_metrics_json_pictures_samples_and_events_hold_what_the_docs_say(evaluated, classifier_cache):
    eval_dir, result = evaluated
    results = json.loads((eval_dir / "metrics.json").read_text())
    assert REQUIRED_KEYS <= set(results) and "modes_covered" not in results  # digits are not stacked
    assert results["num_samples"] == 200 and results["features"] == "classifier"
    assert results["num_real"] == 42 and results["real_split"] == "held-out"  # all of the tiny run's held-out digits
    space = results["feature_space"]
    assert space["network"].startswith("classifier") and space["file"] == results["classifier"]
    assert space["resizer"].startswith("none") and "scale-free" in space["kid_kernel"]
    assert results["generator"] == "EMA" and results["step"] == 6
    assert results["batchnorm_stats"] == "recomputed (2 x 500 samples)"
    assert all(0 <= results[key] <= 1 for key in ("precision", "recall", "coverage"))
    assert results["fid"] > 0 and 0 <= results["classes_covered"] <= 10 and results["classifier_accuracy"] >= 0.9
    # the table and the environment printed, the classifier read from (or cached under) data.root
    environment, log = results["environment"], result.stdout + result.stderr
    assert environment["torch"] == str(torch.__version__)
    trained_on = torch.device(DEVICE or "cpu")  # the tiny run's; TINY_EVAL measures on the CPU
    assert results["training_environment"] == device_environment(trained_on)  # trained in this process
    assert f"Environment: package {environment['package']}, python {environment['python']}, torch " in log
    assert ("Trained in another environment" in log) == (trained_on.type != "cpu")  # only the device differs
    assert "Metrics (classifier features, 200 samples vs 42 held-out images)" in log and "kid_mean" in log
    assert (classifier_cache / results["classifier"].split()[0]).is_file()
    # the pictures (16 px, 2 px padding): 64 samples 8 x 8, 8 rows of 10 steps, 8 rows of a sample and 5 neighbours
    expected = {"samples": (8, 8), "interpolation": (10, 8), "nearest_neighbours": (6, 8)}
    for name, (columns, rows) in expected.items():
        with Image.open(eval_dir / f"{name}.png") as image:
            assert image.size == (columns * 18 + 2, rows * 18 + 2), name
    with np.load(eval_dir / "samples.npz") as saved:
        images = saved["arr_0"]  # np.savez's default key, as metric tools read it
    assert images.dtype == np.uint8 and images.shape == (200, 16, 16, 1)
    events = EventAccumulator(str(eval_dir / "tb"), size_guidance={"images": 0, "scalars": 0, "tensors": 0}).Reload()
    tags = events.Tags()
    assert tags["scalars"] == []  # single numbers go in the table: a one-point chart says nothing
    assert {"summary/samples", "summary/interpolation", "summary/nearest_neighbours"} <= set(tags["images"])
    assert [e.step for e in events.Images("summary/samples")] == [6]
    # the table under the tag itself, not torch add_text's run/eval_metrics/text_summary
    assert [tag for tag in tags["tensors"] if "metrics" in tag] == ["run/eval_metrics"]
    (table,) = events.Tensors("run/eval_metrics")
    assert table.step == 6 and b"fid" in table.tensor_proto.string_val[0]


@pytest.mark.filterwarnings("ignore:`torch.jit.:FutureWarning")  # load and trace: deprecated in torch 2.x
def test_exported_generators_reload_and_match_the_eager_one_and_trace_drops_the_branch(evaluated, tiny_run, tmp_path):
    eval_dir, _ = evaluated
    G, _ = build_generator(load_checkpoint(tiny_run), use_ema=True, device=torch.device("cpu"))
    # the exported G is the measured one: BatchNorm statistics recomputed as evaluate.py does (seeded)
    recompute_batchnorm_stats(G, batches=2, batch_size=500, seed=0, device=torch.device("cpu"))
    assert X.save_generator(G, ExportFormat.none, tmp_path / "export") == []  # export=none writes nothing
    z = torch.randn(5, G.z_dim)
    with torch.no_grad():
        eager, scripted = G.eval()(z), torch.jit.load(str(eval_dir / "export" / X.TORCHSCRIPT_FILE))
        program = torch.export.load(str(eval_dir / "export" / X.EXPORT_FILE)).module()
        traced = torch.jit.trace(X.SamplingGenerator(G), z)  # for contrast (docs/more.md): trace records no `if`
        for module in (scripted, program, traced):
            torch.testing.assert_close(module(z), eager)
        torch.testing.assert_close(program(z[:1]), eager[:1])  # the batch dimension is dynamic
        torch.testing.assert_close(scripted(z[0]), eager[0])  # script kept the one-latent branch
        assert "dim" in scripted.code and "dim" not in traced.code
        with pytest.raises(RuntimeError):
            traced(z[0])  # the batch path, run on one latent: fails inside G's view
        with pytest.raises((RuntimeError, IndexError)):
            program(z[0])  # refused: the program's input checks read a batch dimension it lacks


def compose_evaluate(*overrides: str) -> EvaluateConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=list(overrides))
    return validate_and_check(cfg)


def test_the_evaluate_config_composes_typed_and_needs_a_checkpoint():
    cfg = compose_evaluate("checkpoint=x.pt", "metrics.features=inception", "export=both")
    assert cfg.metrics.features == FeatureSpace.inception and cfg.export == ExportFormat.both
    assert cfg.num_samples == 10000 and cfg.metrics.classifier.min_accuracy == 0.97 and cfg.bn_batches == 20
    nvlabs = ["checkpoint=x.pt", "metrics.features=inception", "metrics.feature_network=n.pt"]
    metrics = compose_evaluate(*nvlabs).metrics
    assert metrics.feature_network == "n.pt" and metrics.inception_weights is None
    for overrides, said in [
        ([], "checkpoint=PATH is required"),
        ([*nvlabs, "metrics.inception_weights=w"], "give one"),
        (["checkpoint=x.pt", "num_samples=1"], "num_samples"),
        (["checkpoint=x.pt", "metrics.inception_weights=w.pth"], "metrics.inception_weights"),  # features=classifier
        (["checkpoint=x.pt", nvlabs[2]], "metrics.feature_network='n.pt' is an Inception-v3 file"),
        (["checkpoint=x.pt", "num_samples=10", "metrics.pr_k=10"], r"num_samples=10 must exceed metrics.pr_k \(10\)"),
    ]:
        pytest.raises(ConfigError, compose_evaluate, *overrides).match(said)


def test_the_ema_generator_is_used_when_the_checkpoint_has_one_and_data_comes_from_it(tmp_path):
    state, cpu = load_checkpoint(tiny_checkpoint(tmp_path)), torch.device("cpu")
    (ema, name), (raw, raw_name) = (build_generator(state, use_ema=use, device=cpu) for use in (True, False))
    assert (name, raw_name) == ("EMA", "raw")
    torch.testing.assert_close(ema.state_dict()["net.0.weight"], 0.5 * raw.state_dict()["net.0.weight"])
    no_ema = load_checkpoint(tiny_checkpoint(tmp_path, ema=False))
    assert build_generator(no_ema, use_ema=True, device=cpu)[1] == "raw"
    elsewhere = str(tmp_path / "elsewhere")
    data = X.data_config_of(state, {"root": elsewhere})  # only the keys given replace the checkpoint's own
    assert (data.name, data.image_size, data.num_samples, data.root) == ("digits", 16, 1200, elsewhere)
    pytest.raises(ConfigError, X.data_config_of, state, {"image_size": 32}).match("data.image_size")


def test_sampling_and_recomputing_batchnorm_statistics_leave_g_in_its_mode(tiny_gan):
    G, _ = tiny_gan
    G.train()
    before = {k: v.clone() for k, v in G.state_dict().items()}
    samples = X.generate(G, 10, 4, seed=3, device=torch.device("cpu"))
    assert G.training  # mode restored, and BatchNorm's running statistics untouched:
    assert all(torch.equal(value, before[key]) for key, value in G.state_dict().items())
    z = torch.cat([torch.randn(n, G.z_dim, generator=g) for g in [torch.Generator().manual_seed(3)] for n in (4, 4, 2)])
    with torch.no_grad():
        expected = X.to_uint8(G.eval()(z))
    assert samples.dtype == torch.uint8 and torch.equal(samples, expected)
    # recomputed BatchNorm statistics keep eval mode and momentum (that they are G's own: test_steps.py's proof)
    G, cpu = G.eval(), torch.device("cpu")
    before = [bn.running_var.clone() for bn in G.modules() if isinstance(bn, torch.nn.BatchNorm2d)]
    assert recompute_batchnorm_stats(G, batches=2, batch_size=64, seed=0, device=cpu)
    after = [bn.running_var for bn in G.modules() if isinstance(bn, torch.nn.BatchNorm2d)]
    assert not G.training and not any(torch.equal(a, b) for a, b in zip(before, after))
    assert all(bn.momentum == 0.1 for bn in G.modules() if isinstance(bn, torch.nn.BatchNorm2d))
    assert not recompute_batchnorm_stats(G, batches=0, batch_size=64, seed=0, device=cpu)


def test_slerp_runs_along_the_sphere_and_hits_both_ends():
    z0, z1 = torch.randn(2, 3, 100, generator=torch.Generator().manual_seed(0))
    z1 = z1 / z1.norm(dim=-1, keepdim=True) * z0.norm(dim=-1, keepdim=True)  # same radius
    path = X.slerp(z0, z1, torch.linspace(0, 1, 7))  # (3, 7, 100)
    torch.testing.assert_close((path[:, 0], path[:, -1]), (z0, z1))
    norms = path.norm(dim=-1) / z0.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(norms, torch.ones_like(norms))  # stays on the sphere
    midpoint = ((z0 + z1) / 2).norm(dim=-1) / z0.norm(dim=-1)
    assert (midpoint < 0.8).all()  # the straight line cuts inside: about 1/sqrt(2) for random directions
    same = X.slerp(z0, z0, torch.tensor([0.5]))  # parallel latents: no division by sin(0)
    torch.testing.assert_close(same[:, 0], z0)


def quick_config(checkpoint: Path, metrics: MetricsConfig, **settings) -> EvaluateConfig:
    quick = dict(device="cpu", threads=1, neighbour_queries=2, grid_samples=4, interpolation_rows=1)
    return EvaluateConfig(checkpoint=str(checkpoint), metrics=metrics, **{**quick, **settings})


def test_evaluate_in_process_on_stacked_data_counts_modes(tmp_path, one_thread, classifier_cache):
    checkpoint = tiny_checkpoint(tmp_path, "data=stacked", "data.image_size=16", "data.num_samples=1200")
    cfg = quick_config(checkpoint, MetricsConfig(kid_subsets=5), num_samples=100)
    results = evaluate(cfg, tmp_path / "eval", {"root": str(classifier_cache.parent)})
    assert {"modes_covered", "mode_kl"} <= set(results) and 0 <= results["modes_covered"] <= 100
    assert results["classes_covered"] <= 10  # digits of the three channels, pooled
    # the classifier of the grayscale source, not of the stacked images: the only one there
    assert [p.name.split("-")[0] for p in classifier_cache.iterdir()] == ["digits"]


@pytest.mark.parametrize("key", ["inception_weights", "feature_network"])
def test_evaluate_end_to_end_with_each_inception_file(
    key, tmp_path, one_thread, inception_weights, nvlabs_inception, caplog
):
    # conftest.py's stand-ins (random torch-fidelity weights, a TorchScript module of NVlabs' signature); 4 samples
    # against 4 held-out images: finite numbers from singular covariances (metrics.fid warns), too few for real ones
    folder = tmp_path / "images"  # data=folder: 100 flat grayscale 16 px images of one class
    folder.mkdir()
    for i in range(100):
        Image.fromarray(np.full((16, 16), i * 255 // 100, dtype=np.uint8)).save(folder / f"{i}.png")
    settings = ("image_size=16", "channels=1", "batch_size=4", "num_samples=4")
    checkpoint = tiny_checkpoint(tmp_path, "data=folder", f"data.root={folder}", *(f"data.{s}" for s in settings))
    path = inception_weights if key == "inception_weights" else nvlabs_inception
    metrics = MetricsConfig(features=FeatureSpace.inception, kid_subsets=5, pr_k=2, dc_k=2, **{key: str(path)})
    cfg = quick_config(checkpoint, metrics, num_samples=4, batch_size=4, bn_batches=1)
    with pytest.raises(MetricsError, match="metrics.features=inception"):  # no labels: no classifier features
        evaluate(dataclasses.replace(cfg, metrics=MetricsConfig(pr_k=2, dc_k=2)), tmp_path / "refused")
    with caplog.at_level(logging.WARNING):
        results = evaluate(cfg, tmp_path / "eval")
    assert "FID from 4 images of 2048 features: the covariances are singular" in caplog.text
    written = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert all(np.isfinite(written[name]) for name in MEASURES) and written["fid"] > 0, written
    assert written["num_samples"] == written["num_real"] == 4 and written["real_split"] == "held-out"
    assert written["features"] == "inception" and written["classifier"] is None  # no labels, no classifier
    space = written["feature_space"]
    assert space["file"] == str(path) and space["dims"] == 2048 and "published KID" in space["kid_kernel"]
    assert space["measures"] == MEASURES and results["feature_space"] == space


def test_a_second_evaluation_into_a_finished_ones_folder_is_refused_and_its_metrics_kept(evaluated, tiny_run):
    folder, _ = evaluated
    before = (folder / "metrics.json").read_bytes()
    result = run_evaluate(f"checkpoint={tiny_run}", *TINY_EVAL, "seed=1", f"hydra.run.dir={folder}")
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert f"{folder} already holds an evaluation (metrics.json)" in output and "Traceback" not in output
    assert (folder / "metrics.json").read_bytes() == before and not (folder / ".lock").exists()


# a checkpoint whose config disagrees with its weights: evaluate.py has no model.* to change -----------------
AT_ODDS = {  # the checkpoint's model.conditional, then conditional=, num_classes=, what the paragraph says
    "conditional marked unconditional, num_classes kept": (
        True, False, 10, "model.conditional=false, but its entry 'num_classes' says"),
    # the first layer of the weights takes z_dim + 10 inputs, the model built from the config z_dim
    "conditional marked unconditional, num_classes 0": (
        True, False, 0, "net.0.weight: (26, 16, 4, 4) in the checkpoint, (16, 16, 4, 4) in the model"),
    "unconditional marked conditional": (
        False, True, 10, "The generator is built from the config stored in {path}: its config and weights"),
}  # fmt: skip


@pytest.mark.parametrize(("trained", "conditional", "num_classes", "said"), AT_ODDS.values(), ids=AT_ODDS)
def test_a_checkpoint_whose_config_and_weights_disagree_is_called_at_odds_with_itself(
    tmp_path, trained, conditional, num_classes, said
):
    path = tiny_checkpoint(tmp_path, f"model.conditional={str(trained).lower()}")
    state = load_checkpoint(path)
    state["config"]["model"]["conditional"] = conditional
    state["num_classes"] = num_classes
    with pytest.raises(CheckpointError) as caught:
        build_generator(state, use_ema=True, device=torch.device("cpu"), source=str(path))
    message = str(caught.value)
    assert f"config stored in {path}" in message and "disagree" in message and "damaged or edited" in message
    assert said.format(path=path) in message


@pytest.mark.slow  # a real Ctrl-C to a real process
def test_sigint_during_evaluate_says_what_was_saved_and_exits_130(tiny_run, tmp_path):
    eval_dir = tmp_path / "eval"
    args = [sys.executable, str(ROOT / "evaluate.py"), f"checkpoint={tiny_run}", "device=cpu", "threads=1"]
    # a classifier to train from scratch for many epochs: the evaluation is still at it when the signal comes
    args += ["num_samples=200", f"data.root={tmp_path / 'data'}", "metrics.classifier.epochs=200"]
    args += [f"hydra.run.dir={eval_dir}"]
    # its own session, as a terminal runs a command: Ctrl-C signals the whole process group
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}
    process = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        lines = run_until(process, "Evaluating ")  # the evaluation is under way
        os.killpg(process.pid, signal.SIGINT)
        returncode, output = finish(process, lines)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert returncode == 130, output[-3000:]
    assert f"Interrupted (SIGINT); nothing measured was saved: {eval_dir} holds no metrics.json" in output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert not (eval_dir / "metrics.json").exists()


def test_the_interruption_line_says_only_what_the_run_dir_holds(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "evaluate.log").write_text("")
    nothing = f"Interrupted (SIGINT); nothing measured was saved: {tmp_path} holds no metrics.json."
    assert X.interrupted(tmp_path) == nothing  # Hydra's own .hydra/ and log are no outputs
    (tmp_path / "samples.png").write_bytes(b"")
    assert X.interrupted(tmp_path).endswith("holds no metrics.json, only partial outputs (samples.png).")
    (tmp_path / "metrics.json").write_text("{}")
    assert X.interrupted(tmp_path).startswith(f"Interrupted (SIGINT) after the metrics were saved to {tmp_path}")


@pytest.mark.parametrize("use_ema", [False, True], ids=["G", "G_ema"])
def test_a_nan_in_a_batchnorm_statistic_alone_is_refused_by_evaluate(tiny_run, use_ema):
    # the statistics are buffers, not weights: evaluate.py with bn_batches=0 would sample with them
    state, entry = torch.load(tiny_run / "checkpoints" / "last.pt", weights_only=True), "G_ema" if use_ema else "G"
    key = next(k for k in state[entry] if k.endswith("running_var"))
    state[entry][key][0] = float("nan")
    with pytest.raises(CheckpointError) as caught:
        build_generator(state, use_ema=use_ema, device=torch.device("cpu"), source="damaged.pt")
    assert "holds NaN or inf in 1 of its" in str(caught.value) and key.removeprefix("module.") in str(caught.value)
    assert build_generator(state, use_ema=not use_ema, device=torch.device("cpu"))[1] == ("raw" if use_ema else "EMA")


TINY_SPLIT = "real images; the held-out split of data=digits holds 42"
REFUSED = {  # metrics.* -> what the refusal says
    # num_samples (10,000 by default) is enough: the held-out split of the tiny digits (42 images) is not
    "pr_k": (dict(pr_k=1000), f"metrics.pr_k=1000 needs more than 1000 {TINY_SPLIT}"),
    "dc_k": (dict(dc_k=500), f"metrics.dc_k=500 needs more than 500 {TINY_SPLIT}"),
    # Inception's files are checked before anything else: here the checkpoint does not exist
    "inception": (dict(features=FeatureSpace.inception, inception_weights="w.pth"), "w.pth: no such file"),
}  # fmt: skip


@pytest.mark.parametrize("metrics, said", REFUSED.values(), ids=REFUSED)
def test_a_neighbour_count_or_inception_file_it_cannot_use_is_refused(tiny_run, tmp_path, metrics, said):
    checkpoint = tmp_path / "missing.pt" if "inception_weights" in metrics else tiny_run
    with pytest.raises(MetricsError, match=re.escape(said)):
        evaluate(quick_config(checkpoint, MetricsConfig(**metrics)), tmp_path / "eval", {"root": str(tmp_path)})


def test_an_evaluation_into_a_folder_another_holds_is_refused_naming_the_holder(tiny_run, tmp_path):
    folder = tmp_path / "eval"
    with Run(folder).owned():
        result = run_evaluate(f"checkpoint={tiny_run}", f"hydra.run.dir={folder}", "threads=1", cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2, output[-3000:]
    assert f"The run directory {folder} is in use: process {os.getpid()}" in output
    assert "it is training or evaluating there" in output
    assert list(folder.iterdir()) == []  # the holder's lock went with it; the refused evaluation wrote nothing
