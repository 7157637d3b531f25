"""The tool as others use it: the wheel's commands, the quick start as typed, the notebook API (gan.train,
gan.load_generator, gan.sample, gan.evaluate, gan.__version__), and the environment every run records."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from conftest import DEVICE, ROOT, TINY, run_evaluate, run_train
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_evaluate import TINY_EVAL

import gan
from gan.checkpoint import load_checkpoint, save_checkpoint
from gan.device import cpu_model, environment
from gan.errors import ConfigError
from gan.training import train

# the files a wheel is built from: the package's code, its two programs and the configs it ships
SOURCES = ("pyproject.toml", "README.md", "train.py", "evaluate.py", "generate.py", "gan", "configs")


@pytest.mark.slow
def test_the_wheel_installs_commands_that_train_and_evaluate_from_any_folder(tmp_path):
    (source := tmp_path / "source").mkdir()  # a copy: a build in place would leave build/ and *.egg-info in the clone
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if name == "gan" else {}))
    pip, out = [sys.executable, "-m", "pip"], {"capture_output": True, "text": True}
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", tmp_path / "dist", source]
    built = subprocess.run(build, **out)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("dcgan_reference-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"gan/configs/{p.relative_to(ROOT / 'configs').as_posix()}" for p in (ROOT / "configs").rglob("*.yaml")}
    code = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gan").rglob("*.py")}
    programs = {f"gan/commands/{name}.py" for name in ("train", "evaluate", "generate")}
    assert configs <= names and code <= names and programs <= names

    # a fresh venv, offline: the wheel alone, its dependencies seen through a .pth naming the folders this
    # interpreter imports them from (its site-packages, and those its own .pth files add)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], **out)
    purelib = purelib.stdout.strip()
    dependencies = [path for path in sys.path if Path(path).name in ("site-packages", "dist-packages")]
    Path(purelib, "dependencies.pth").write_text("".join(f"{path}\n" for path in dependencies))
    installed = subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], **out)
    assert installed.returncode == 0, installed.stderr[-3000:]

    (elsewhere := tmp_path / "elsewhere").mkdir()  # outside the repository: nothing there but what the commands write
    where = subprocess.run([python, "-c", "import gan; print(gan.__file__)"], cwd=elsewhere, capture_output=True)
    assert where.stdout.decode().startswith(purelib), where  # the wheel's package, not the clone's

    def command(name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([venv / "bin" / name, *args], cwd=elsewhere, env={**os.environ, **env}, **out)

    trained = command("dcgan-train", *TINY)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run_dir,) = (elsewhere / "outputs").glob("*/*debug-tiny*")  # Hydra's dated folder, under this cwd
    assert (run_dir / "checkpoints" / "last.pt").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
    recorded = load_checkpoint(run_dir)["environment"]
    assert recorded["package"] == gan.__version__ and recorded["device"] == f"cpu ({cpu_model()})"
    assert "git_commit" not in recorded  # an installed package has no clone
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0}).Reload()
    command_line = events.Tensors("run/command")[0].tensor_proto.string_val[0].decode()
    assert command_line.startswith("`dcgan-train debug=tiny"), command_line  # the command that ran (inline code)

    refused = command("dcgan-train", *TINY, "optim.lr=-1")
    assert refused.returncode == 2 and "optim.lr=-1.0 must be > 0" in refused.stdout + refused.stderr

    evaluated = command("dcgan-evaluate", f"checkpoint={run_dir}", *TINY_EVAL)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (metrics,) = (elsewhere / "outputs" / "eval").glob("*/*/metrics.json")
    assert json.loads(metrics.read_text())["step"] == 6
    said = f"Environment: package {gan.__version__}, python {sys.version.split()[0]}"
    assert said in evaluated.stdout + evaluated.stderr

    generated = command("dcgan-generate", f"checkpoint={run_dir}", "num=64", "out=images")
    assert generated.returncode == 0 and len(list((elsewhere / "images").glob("*.png"))) == 64, generated.stderr

    for name in ("dcgan-train", "dcgan-evaluate", "dcgan-generate"):  # Hydra's flags, the program named as invoked
        helped = command(name, "--help")
        assert helped.returncode == 0 and helped.stdout.startswith(f"{name}: "), helped.stderr[-3000:]
        shown = command(name, "--cfg", "job")
        assert shown.returncode == 0 and yaml.safe_load(shown.stdout), shown.stderr[-3000:]
    completion = command("dcgan-train", "-sc", "install=bash")
    assert completion.returncode == 0 and completion.stdout.rstrip().endswith("-F hydra_bash_completion dcgan-train")
    queried = command("dcgan-train", "-sc", "query=bash", COMP_LINE="dcgan-train optim.l")
    assert "optim.lr=" in queried.stdout.split(), queried.stderr[-3000:]

    packed = command("dcgan-pack", "pack", "data=digits", "data.num_samples=300", "data.image_size=16")
    assert packed.returncode == 0 and (elsewhere / "pack" / "pack.pt").is_file(), packed.stderr[-3000:]
    helped = command("dcgan-pack", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: dcgan-pack"), helped.stderr[-3000:]


def test_the_notebook_api_trains_loads_and_samples_in_a_few_lines(tmp_path, one_thread):
    result = gan.train(tmp_path / "run", *TINY, "loss=hinge", "model.conditional=true")  # one_thread: count put back
    G = gan.load_generator(result.checkpoint)
    assert not any(module.training for module in G.modules())  # eval mode: BatchNorm's running statistics
    images = gan.sample(G, 10, seed=1)
    assert result.step == 6 and images.shape == (10, 1, 16, 16)
    assert images.abs().max() <= 1 and torch.equal(images, gan.sample(gan.load_generator(tmp_path / "run"), 10, seed=1))
    assert not torch.equal(images, gan.sample(G, 10, seed=2))
    assert load_checkpoint(result.checkpoint)["config"]["loss"]["name"] == "hinge"
    for classes in (torch.tensor([10, 1]), torch.tensor([-1, 1]), torch.tensor([1]), [1, 2], torch.tensor([1.0, 2.0])):
        with pytest.raises(ConfigError, match=r"must be a tensor of 2 class numbers from 0 to 9"):
            gan.sample(G, 2, classes=classes)
    assert gan.sample(G, 2, classes=torch.tensor([9, 0])).shape == (2, 1, 16, 16)


def test_the_quick_start_trains_then_evaluates_as_typed_and_gan_evaluate_returns_what_metrics_json_holds(
    tmp_path, one_thread, classifier_cache, caplog
):
    cached = shutil.copytree(classifier_cache, tmp_path / "data" / "classifiers")  # the session's: not trained again
    trained = run_train("debug=tiny", tiny=False, cwd=tmp_path)  # docs/package.md, as typed
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs").glob("*/*_debug-tiny")
    # the metrics classifier of 10,000 digits (its cache key), not the 256 the run drew, passes its 97% bar
    evaluated = run_evaluate(f"checkpoint={run_dir.relative_to(tmp_path)}", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (metrics,) = (tmp_path / "outputs" / "eval").glob("*/*/metrics.json")
    assert json.loads(metrics.read_text())["classifier_accuracy"] >= 0.97
    overrides = ("num_samples=200", "device=cpu", "metrics.kid_subsets=10", f"data.root={tmp_path / 'data'}")
    with caplog.at_level(logging.INFO):
        results = gan.evaluate(run_dir, *overrides, run_dir=tmp_path / "eval")
    assert results == json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert results["num_samples"] == 200 and f"Metrics classifier: {cached}" in caplog.text  # read from data.root
    again = gan.evaluate(run_dir, *overrides)  # into a temporary folder, removed afterwards
    assert again["fid"] == results["fid"] > 0
    pytest.raises(ConfigError, gan.evaluate, run_dir, "num_samplez=3").match("num_samplez")


def test_gan_version_is_the_installed_packages(monkeypatch):
    not_installed = mock.Mock(side_effect=importlib.metadata.PackageNotFoundError)
    monkeypatch.setattr(importlib.metadata, "version", not_installed)  # a clone used without pip install
    assert importlib.reload(gan).__version__ == "unknown"
    monkeypatch.undo()
    assert importlib.reload(gan).__version__ == importlib.metadata.version("dcgan-reference")


def test_the_api_refuses_what_the_command_line_refuses(tmp_path):
    pytest.raises(ConfigError, gan.train, tmp_path / "a", *TINY, "optim.lr=-1").match(r"optim.lr=-1.0 must be > 0")
    pytest.raises(ConfigError, gan.train, tmp_path / "b", "nosuch=1").match("nosuch")
    cfg = gan.compose_config(*TINY)
    cfg.data.batch_size = 0  # set in code, where no command line checks it
    pytest.raises(ConfigError, gan.train, tmp_path / "c", config=cfg).match(r"data.batch_size=0")
    cfg.data.batch_size = "many"  # a wrong type: OmegaConf's check, as on the command line
    pytest.raises(ConfigError, gan.train, tmp_path / "d", config=cfg).match("many")
    assert not any(tmp_path.iterdir())  # nothing written by a refused run
    cfg.data.batch_size, cfg.optim.lr = 32, float("nan")
    pytest.raises(ConfigError, train, cfg, tmp_path / "e").match("optim.lr")  # the loop checks a config built in code


# each bad argument -> the word its message starts with; torch would raise a TypeError, a RuntimeError or an
# overflow from deep inside, or (classes for an unconditional G, ema="no") quietly ignore or misread it
BAD_CALLS = {
    "n=0": (lambda G: gan.sample(G, 0), "n=0"),
    "n=2.5": (lambda G: gan.sample(G, 2.5), "n=2.5"),
    "seed=2**70": (lambda G: gan.sample(G, 2, seed=2**70), "seed="),
    "classes, unconditional G": (lambda G: gan.sample(G, 2, classes=torch.tensor([0, 1])), "classes="),
    "G=a path": (lambda G: gan.sample("outputs/run", 2), "type(G)='str'"),
    "device=tpu": (lambda G: gan.load_generator("run", device="tpu"), "device='tpu'"),
    "device=''": (lambda G: gan.load_generator("run", device=""), "device=''"),
    "path=None": (lambda G: gan.load_generator(None), "path=None"),
    "ema='no'": (lambda G: gan.load_generator("run", ema="no"), "ema='no'"),
    "overrides in a list": (lambda G: gan.compose_config(["loss=hinge"]), "overrides="),
    "run_dir=None": (lambda G: gan.train(None, *TINY), "run_dir=None"),
    "run_dir=a file": (lambda G: gan.train(__file__, *TINY), f"run_dir={__file__!r} is a file"),
    "config=a dict": (lambda G: gan.train("r", config={"data": {}}), "config='dict' must be a TrainConfig"),
    "config and overrides": (lambda G: gan.train("r", "loss=hinge", config=gan.compose_config()), "overrides='loss"),
    "data.root=": (lambda G: gan.compose_config("data.root="), "data.root=''"),  # Path(""): the working directory
    "trainer.resume=": (lambda G: gan.compose_config("trainer.resume="), "trainer.resume=''"),  # a new run, unasked
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_the_api_refuses_a_bad_argument_naming_it(tiny_run, case):
    call, named = BAD_CALLS[case]
    with pytest.raises(ConfigError) as caught:
        call(gan.load_generator(tiny_run))
    assert str(caught.value).startswith(named) and "\n" not in str(caught.value)


# the environment ------------------------------------------------------------------------------------


def test_a_checkpoint_records_the_environment_it_was_written_in(tiny_run):
    recorded, trained_on = load_checkpoint(tiny_run)["environment"], torch.device(DEVICE or "cpu")
    assert recorded == environment(trained_on)
    assert recorded["torch"] == torch.__version__ and recorded["device_count"] >= 1
    assert recorded["python"] == sys.version.split()[0] and recorded["package"] == gan.__version__
    if trained_on.type == "cpu":  # a GPU's name: the test below
        assert recorded["device"] == f"cpu ({cpu_model()})"
    if shutil.which("git"):  # a commit of this clone (HEAD when the run started), and whether files differed
        known = subprocess.run(["git", "cat-file", "-t", recorded["git_commit"]], cwd=ROOT, capture_output=True)
        assert known.stdout == b"commit\n" and len(recorded["git_commit"]) == 40
        assert isinstance(recorded["git_dirty"], bool)


@pytest.mark.cuda
def test_a_gpu_is_recorded_by_name_with_the_cudnn_in_use():
    recorded = environment(torch.device("cuda"))
    assert recorded["device"] == torch.cuda.get_device_name() and recorded["device_count"] == torch.cuda.device_count()
    assert recorded["cudnn"] == torch.backends.cudnn.version() and recorded["cuda"] == torch.version.cuda


@pytest.mark.parametrize("recorded", ["other torch", "none recorded"])
def test_a_resume_warns_when_the_environment_changed(tiny_run, tmp_path, recorded):
    run_dir = shutil.copytree(tiny_run, tmp_path / "run")
    state = load_checkpoint(run_dir)
    if recorded == "other torch":
        state["environment"] = {**state["environment"], "torch": "1.0.0"}
    else:  # written before runs recorded it: resumed without a word about it
        del state["environment"]
    save_checkpoint(state, run_dir / "checkpoints" / "last.pt")
    resumed = run_train(f"trainer.resume={run_dir}", "trainer.max_steps=8", "trainer.threads=1", tiny=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    warned = f"torch: 1.0.0 -> {torch.__version__}" in log and "bit for bit" in log
    assert warned == (recorded == "other torch"), log[-3000:]
    assert load_checkpoint(run_dir)["environment"]["torch"] == torch.__version__  # the continuation's own
