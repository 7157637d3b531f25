"""gan/launch.py: the programs are Hydra apps: every flag works as Hydra documents it; a refusal is one paragraph."""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY, compose_config, in_process, output_of, run_train, snapshot
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from gan import launch
from gan.checkpoint import load_checkpoint
from gan.config import to_plain
from gan.device import available_cpus

PROGRAMS = ("train.py", "evaluate.py", "generate.py")
PACKAGE = {"train.py": "trainer", "evaluate.py": "metrics", "generate.py": "seed"}  # for --package (generate: no group)


def run(program: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return in_process(importlib.import_module(program.removesuffix(".py")).main, list(argv), cwd)


# Hydra's own flags (GROUP: a group of the program's config): each exits 0, prints what Hydra documents, writes nothing
FLAGS = ("--cfg job", "-c job", "--cfg=job", "--cfg hydra", "--cfg all", "--cfg job --package GROUP")
FLAGS += ("-c job -p GROUP --resolve", "--info defaults", "--info", "--hydra-help")


@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("program", PROGRAMS)
def test_hydras_flags_work_as_hydra_documents_them_and_write_nothing(program, flags, tmp_path):
    flags = flags.replace("GROUP", PACKAGE[program]).split()
    result = run(program, *flags, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output and not any(tmp_path.iterdir()), output[-3000:]
    if flags[0] in ("--cfg", "-c", "--cfg=job") and "hydra" not in flags:
        printed = yaml.safe_load(result.stdout)
        if ("-p" in flags or "--package" in flags) and program == "generate.py":
            assert printed == 0  # a key's value: generate's config has no group
        elif "-p" in flags or "--package" in flags:
            assert ("max_steps" if program == "train.py" else "features") in printed  # the group's own keys
        else:
            assert set(printed) >= ({"data", "model", "trainer"} if program == "train.py" else {"checkpoint"})
    said = {"hydra": "  run:", "--info": "Defaults List", "--hydra-help": "--cfg,-c"}
    assert all(line in output for flag, line in said.items() if flag in flags)


# each program once (Hydra's help lists every group's options: a second each), each way of invoking one at least once
@pytest.mark.parametrize(("program", "invoked"), [*zip(PROGRAMS, ["python {file}", "dcgan-{name}", "python {file}"])])
def test_help_names_the_program_as_it_was_invoked(program, invoked, tmp_path, monkeypatch):
    # and so does Hydra's bash completion script: `python` for a .py file, else the command
    name = program.removesuffix(".py")
    shown = invoked.format(file=program, name=name)
    monkeypatch.setitem(launch.PROGRAMS, name, shown)
    result, script = run(program, "--help", cwd=tmp_path), run(program, "-sc", "install=bash", cwd=tmp_path)
    assert result.returncode == script.returncode == 0 and not any(tmp_path.iterdir())
    assert result.stdout.startswith(f"{shown}: ") and "powered by Hydra" not in result.stdout
    assert "== Configuration groups ==" in result.stdout and "== Config ==" in result.stdout
    assert script.stdout.rstrip().endswith(f"-F hydra_bash_completion {shown.split()[0]}")


@pytest.mark.parametrize(("typed", "offered"), [("optim.l", "optim.lr="), ("los", "loss="), ("loss=h", "loss=hinge")])
def test_the_completion_query_offers_the_configs_keys_and_options(typed, offered, tmp_path, monkeypatch):
    monkeypatch.setenv("COMP_LINE", f"python train.py {typed}")
    result = run("train.py", "-sc", "query=bash", cwd=tmp_path)
    assert result.returncode == 0 and offered in result.stdout.split() and not any(tmp_path.iterdir())


def test_config_dir_and_config_name_compose_a_users_own_primary_config_with_the_overrides(tmp_path):
    (mine := tmp_path / "mine").mkdir()
    (mine / "short.yaml").write_text("defaults:\n  - train\n  - _self_\n\ntrainer:\n  max_steps: 3\n")
    for cd, cn in (("-cd", "-cn"), ("--config-dir", "--config-name")):
        argv = (cd, str(mine), cn, "short", "--cfg", "job", "loss=hinge", "optim.lr=1e-4")
        result = run("train.py", *argv, cwd=tmp_path)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        printed = yaml.safe_load(result.stdout)
        assert (printed["trainer"]["max_steps"], printed["loss"]["name"], printed["optim"]["lr"]) == (3, "hinge", 1e-4)


# A command refused, by Hydra or by the config's checks: one paragraph naming the setting (each |-separated part),
# exit 2, no traceback, nothing written; Hydra alone would print several paragraphs and exit 1. {cpus}: the CPUs this
# process may use, read from the machine.
REFUSED = {
    "a wrong type": (["optim.lr=abc"], "Value 'abc' of type 'str' could not be converted to Float"),
    "a float for a whole number": (["trainer.max_steps=1.5"], "trainer.max_steps|'1.5'"),
    "a typo of an option": (["trainer.precision=fp64"], "trainer.precision|'fp64'"),  # an enum: data.name, loss.name
    "an unknown option in a list": (["model.diffaugment=[rotate]"], "model.diffaugment|'rotate'"),
    "a list for a number": (["optim.lr=[1,2]"], "optim.lr"),
    "a dict for a number": (["optim.lr={a:1}"], "optim.lr"),
    "an empty number": (["trainer.max_steps="], "trainer.max_steps"),
    "an unknown key, with the nearest": (["optim.lrr=1"], "Did you mean optim.lr?"),
    "an unknown group option, with the list": (["loss=nosuch"], "Choose one of bce, hinge, wgan_gp for loss="),
    "a plugin's option, with its extra": (["hydra/launcher=nosuch"], "come with Hydra plugins"),
    "no '='": (["max_steps"], "'max_steps'"),
    "a character the grammar has no token for": (["model.z_dim=\u00fc"], "model.z_dim"),
    "an unreadable value": (["data.batch_size=[1,"], "Hydra's override grammar cannot read"),
    "a key kept by Hydra, then read by nothing": (["+trainer.foo=1"], "trainer.foo is not a setting"),
    "a path holding '='": (["data.root=a=b"], "Quote it for Hydra inside the shell's quotes: \"data.root='a=b'\""),
    "a sweep job's run": (["trainer.resume=/r/0_optim.lr=0.002"], "quotes: \"trainer.resume='/r/0_optim.lr=0.002'\""),
    "a renamed setting": (["trainer.on_collapse=warn"], "was renamed trainer.on_d_won"),
    "an interpolation of nothing": (["trainer.max_steps=${nosuch}"], "nosuch"),
    "an empty run folder": (["hydra.run.dir="], "hydra.run.dir= is empty (an unset shell variable?)"),
    "an empty run folder, quoted": (["hydra.run.dir=''"], "hydra.run.dir= is empty (an unset shell variable?)"),
    # would start a new run; would read the launch directory as the dataset, or its checkpoints/last.pt
    "an empty resume": (["trainer.resume="], "checkpoint path is empty (an unset shell variable?)"),
    "an empty data.root": (["data.root="], "data.root='' is empty"),
    "an empty checkpoint": (["evaluate.py", "checkpoint="], "checkpoint path is empty (an unset shell variable?)"),
    "a seed beyond torch's 64 bits": (["trainer.seed=99999999999999999999"], "trainer.seed"),
    "a process per worker": (["data.num_workers=100000"], "data.num_workers"),
    "an image too small": (["data.image_size=24"], "data.image_size"),
    "an image too large": (["data.image_size=512"], "data.image_size"),
    "no batch": (["data.batch_size=0"], "data.batch_size"),
    "no rate": (["optim.lr=0"], "optim.lr"),
    "an unknown device": (["trainer.device=gpu"], "trainer.device"),
    "a negative weight": (["loss.feature_matching=-1"], "loss.feature_matching"),
    "a negative limit": (["data.limit=-1"], "data.limit"),
    "a limit below debug=tiny's batch of 32": (["data.limit=16"], "data.limit"),
    "a minibatch-stddev group larger than the batch": (["model.minibatch_std=64"], "model.minibatch_std=64"),
    "a conditional pack": (["model.conditional=true", "model.pack=2"], "model.pack"),
    "a negative overfit_every": (["trainer.overfit_every=-1"], "trainer.overfit_every"),
    "threads that segfaulted": (["trainer.threads=1000000"], "trainer.threads=1000000 is more than the {cpus} CPU(s)"),
    "threads that overflowed": (["trainer.threads=1099511627776"], "trainer.threads=1099511627776 is more than the"),
    "a rate once blamed on optim.lr after a step": (["optim.lr_d=inf"], "optim.lr_d=inf must be a finite number"),
    "a group that does not divide a pack": (
        ["model.minibatch_std=5", "model.pack=2", "data.batch_size=32"],
        "model.minibatch_std=5 must divide the 16 samples D judges at once (data.batch_size=32 / model.pack=2)|"
        "groups of 1 sample, a constant channel|such as 4",
    ),
    "--resolve alone": (["--resolve"], "--resolve flag can only be used in conjunction with --cfg or --help"),
    "a bad value in a sweep": (["-m", "optim.lr=1e-4,abc"], "optim.lr=abc|could not be converted|Nothing was written"),
    "a sweep under torchrun": (["-m", "optim.lr=1e-4,2e-4", "TORCHRUN"], "A Hydra sweep (-m) launches several jobs"),
    "an empty sweep folder": (["-m", "hydra.sweep.dir="], "hydra.sweep.dir= is empty"),
    "a config folder that does not exist": (["train.py", "-cd", "nowhere", "--cfg", "job"], "nowhere"),
    "evaluate.py's unknown key": (["evaluate.py", "checkpoint=x", "num_samplez=3"], "Did you mean num_samples?"),
    "evaluate.py's wrong type": (["evaluate.py", "checkpoint=x", "num_samples=abc"], "num_samples=abc|'abc'|Nothing"),
}


@pytest.mark.parametrize(("argv", "said"), REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_command_is_one_paragraph_exit_2_and_writes_nothing(argv, said, tmp_path, monkeypatch):
    if "TORCHRUN" in argv:
        for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
            monkeypatch.setenv(name, value)
        argv = argv[:-1]
    result = run(*argv, cwd=tmp_path) if argv[0].endswith(".py") else run_train(*argv, cwd=tmp_path)
    output = output_of(result)
    assert result.returncode == 2 and "Traceback" not in output and "Non-finite loss" not in output, output[-3000:]
    parts = said.replace("{cpus}", str(available_cpus())).split("|")
    assert all(part in output for part in parts) and not any(tmp_path.iterdir()), output[-3000:]
    assert len([line for line in output.splitlines() if line.strip()]) == 1, output  # one paragraph, one line


def test_hydra_full_error_keeps_hydras_own_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(Exception, match="Error merging override optim.lr=abc"):
        run_train("optim.lr=abc", cwd=tmp_path)


def test_a_sweep_with_resume_auto_continues_each_jobs_own_run(tmp_path):
    # with no run to continue, each job starts one; a bad job (optim.lr=-1) is said without a traceback, and the
    # others run: Hydra's exit 1
    sweep = tmp_path / "sweep"
    common = ("-m", "optim.lr=1e-3,-1,2e-3", f"hydra.sweep.dir={sweep}")
    first = run_train(*common, "trainer.max_steps=2", "trainer.resume=auto", cwd=tmp_path)
    assert first.returncode == 1 and "optim.lr=-1.0 must be > 0." in output_of(first), output_of(first)[-3000:]
    assert "Traceback" not in output_of(first)
    jobs, before = sorted(p.parent.parent for p in sweep.rglob("last.pt")), snapshot(sweep)
    again = output_of(run_train(*common, "trainer.max_steps=2", cwd=tmp_path))  # the same sweep, the same folder
    assert f"hydra.sweep.dir={sweep} holds a sweep (multirun.yaml)" in again and "Add trainer.resume=auto" in again
    assert snapshot(sweep) == before
    resumed = run_train(*common, "trainer.max_steps=4", "trainer.resume=auto", cwd=tmp_path)
    assert resumed.returncode == 1 and "Traceback" not in output_of(resumed), output_of(resumed)[-3000:]
    assert [load_checkpoint(job)["step"] for job in jobs] == [4, 4]
    assert [load_checkpoint(job)["config"]["optim"]["lr"] for job in jobs] == [1e-3, 2e-3]


UNWRITABLE = {  # the folder a command names -> (its key, the folder, whether a sweep); a file blocks tmp/afile/...
    "a run under a file": ("hydra.run.dir", "afile/run", False),
    "a sweep under a file": ("hydra.sweep.dir", "afile/sweep", True),
    # os.access says /proc is writable to root, yet nothing can be created in it: the pre-check must try
    "a run in /proc": ("hydra.run.dir", "/proc/dcgan-reference-run", False),
}


@pytest.mark.parametrize(("key", "folder", "sweep"), UNWRITABLE.values(), ids=UNWRITABLE.keys())
def test_a_run_folder_that_cannot_be_created_is_refused_before_hydra_naming_why(tmp_path, key, folder, sweep):
    if folder.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("needs Linux's /proc, a folder no file can be created in")
    blocker, target = tmp_path / "afile", tmp_path / folder
    blocker.write_text("not a folder\n")
    result = run_train(*(["-m", "optim.lr=0.002,0.003"] if sweep else []), f"{key}={target}", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output[-3000:]
    assert f"Cannot write the run directory {target}: " in output and f"{key}=PATH" in output
    if target.is_relative_to(tmp_path):
        assert f"{blocker} is not a directory" in output
    assert blocker.read_text() == "not a folder\n" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.slow  # a process is the point: bash runs the completion script Hydra prints, then the query it makes
def test_tab_completion_works_in_bash_after_eval(tmp_path):
    script = f"""
        cd {ROOT}
        eval "$(python train.py -sc install=bash)"
        COMP_LINE="python train.py optim.l"; COMP_POINT=23; COMP_CWORD=2
        hydra_bash_completion
        echo "${{COMPREPLY[@]}}"
    """
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # `python` is this one
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "optim.lr=" in done.stdout.split()


POSIX_ONLY = {"fcntl", "resource", "termios", "pwd", "grp"}  # standard modules Windows lacks


@pytest.mark.parametrize("path", [*(ROOT / p for p in PROGRAMS), *sorted((ROOT / "gan").rglob("*.py"))])
def test_no_module_of_the_project_imports_at_its_top_what_windows_lacks(path):
    tree = ast.parse(path.read_text())
    imported = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & POSIX_ONLY, f"{path.relative_to(ROOT)} imports {imported & POSIX_ONLY} at its top"


# Every command the lesson prints (README, the walkthrough, more.md, the tour) composes as written: each runs here
# with `--cfg job` added, which prints the config it composes and trains nothing.
LESSON = ("README.md", "docs/walkthrough.md", "docs/more.md", "docs/tour.ipynb")
COMMAND = re.compile(r"python (train|evaluate)\.py((?: +[^\s`#;)\"\\]+)*)")


def test_every_command_the_lesson_prints_composes_as_written(tmp_path):
    commands = []
    for page in LESSON:
        text = (ROOT / page).read_text(encoding="utf-8")
        if page.endswith(".ipynb"):
            text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
        text = re.sub(r"(?<!`)`[^`]+`(?!`)", lambda span: span[0].replace("\n", " "), text)  # spans, unwrapped
        for program, args in COMMAND.findall(text):
            argv = [arg.strip("'") for arg in args.split()]
            if "..." not in argv and "-sc" not in argv:  # -sc: its own test above
                commands.append((f"{program}.py", argv))
    assert len({program for program, _ in commands}) == 2 and len(commands) > 10, commands
    for program, argv in commands:
        jobs = [argv]
        if "-m" in argv:  # a sweep, which --cfg refuses: each of its jobs
            pairs = (arg.split("=", 1) for arg in argv if arg != "-m")
            jobs = itertools.product(*([f"{key}={value}" for value in values.split(",")] for key, values in pairs))
        for job in jobs:
            result = run(program, *job, *([] if "--cfg" in job else ["--cfg", "job"]), cwd=tmp_path)
            assert result.returncode == 0 and "Traceback" not in result.stderr, (program, job, result.stderr[-2000:])


@pytest.mark.parametrize("flag", ["--experimental-rerun", "--experimental-rerun=x", "--exp"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_hydras_rerun_which_unpickles_a_file_is_refused(program, flag, tmp_path):
    (tmp_path / "config.pickle").write_bytes(b"cos\nsystem\n(S'touch pwned'\ntR.")
    result = run(program, flag, str(tmp_path / "config.pickle"), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "--experimental-rerun unpickles a file" in output, output[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.pickle"]


ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0"}


@pytest.mark.slow  # a signal to a real process, and the line it prints pasted into a shell
@pytest.mark.parametrize("name", ["with space", "lr=1e-3,seed=2", "it's"])
def test_the_resume_line_a_stopped_run_prints_works_when_pasted(tmp_path, name):
    run_dir = tmp_path / name / "run"
    args = [sys.executable, str(ROOT / "train.py"), *TINY, f"hydra.run.dir={launch.hydra_quote(run_dir)}"]
    endless = [*args, "trainer.max_steps=100000", "trainer.checkpoint_every=100000"]
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    process = subprocess.Popen(endless, cwd=tmp_path, env=ENV, **pipe)
    seen = []
    for line in process.stdout:  # training is under way (its signal handlers set) once a step is logged
        seen.append(line)
        if "time/first_step_s" in line:
            break
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=120)
    out = "".join(seen) + out
    assert process.returncode == 143, out[-3000:]
    line = out.split("Resume with:\n", 1)[1].splitlines()[0].strip()
    step = load_checkpoint(run_dir)["step"]
    assert line.startswith("python train.py ")
    pasted = line.replace("python train.py", f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'train.py'))}", 1)
    again = ["bash", "-c", f"{pasted} trainer.max_steps={step + 1}"]
    result = subprocess.run(again, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, output_of(result)[-3000:]
    assert load_checkpoint(run_dir)["step"] == step + 1


@pytest.mark.parametrize(
    "path", ["/a b/c", "/x=1,y=2/r", "/it's/r", "/back\\slash/r", "/end\\", '/q"x', "/a'b\\'c", "/plain"]
)
def test_paths_are_quoted_for_hydra_and_the_shell(path):
    assert OverridesParser.create().parse_override(f"trainer.resume={launch.hydra_quote(path)}").value() == path
    printf = f"printf %s {launch.resume_command(path).removeprefix('python train.py ')}"
    echoed = subprocess.run(["bash", "-c", printf], capture_output=True)
    assert OverridesParser.create().parse_override(echoed.stdout.decode()).value() == path


RECORDS = {  # a record trainer.resume=auto cannot read -> what its warning says (said, not skipped)
    "not UTF-8": (b"model: {g_width: 8}\n\xff\xfe\n", "'utf-8' codec can't decode byte 0xff"),
    "a group replaced by a number": (b"loss: 5\n", "its group 'loss' is 5"),
}


@pytest.mark.parametrize("where", ["sweep/0_optim.lr=0.002", "runs/a"])  # a sweep's job; a run without overrides.yaml
def test_resume_auto_finds_the_matching_run_wherever_it_lies_under_outputs(tiny_run, tmp_path, caplog, where):
    run_dir = shutil.copytree(tiny_run, tmp_path / "outputs" / where)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(to_plain(compose_config())))
    if where == "runs/a":
        (run_dir / ".hydra" / "overrides.yaml").unlink()
    for name, (record, _) in RECORDS.items():  # newer runs whose record it cannot read: said, and not continued
        for path, content in ((Path("checkpoints/last.pt"), b""), (Path(".hydra/config.yaml"), record)):
            (tmp_path / "outputs" / name / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "outputs" / name / path).write_bytes(content)
    outputs, fresh = tmp_path / "outputs", tmp_path / "new"
    wanted = to_plain(compose_config("trainer.threads=2", "trainer.max_steps=9"))  # runtime keys differ
    assert launch.resume_auto(wanted, fresh, outputs) == run_dir / "checkpoints" / "last.pt"
    for name, (_, says) in RECORDS.items():
        assert f"{outputs / name / '.hydra' / 'config.yaml'} cannot be read ({says}" in caplog.text
    for other in ("loss=hinge", "optim.lr=3e-4"):  # another run's settings: a rate too (a sweep's points are runs)
        assert launch.resume_auto(to_plain(compose_config(other)), fresh, outputs) is None


@pytest.mark.slow  # a fresh interpreter is the point: what the flags import, not what this process holds
def test_hydras_flags_each_tab_of_completion_and_a_refused_override_import_no_torch():
    # each TAB runs the program with -sc query=bash: torch's import (seconds) would be felt at every key press;
    # an override Hydra's grammar refuses (no '=') is said before any job, so before torch too
    code = """if True:
        import runpy, sys
        for program in sys.argv[1:]:
            for flags, code in (["-sc", "query=bash"], 0), (["--help"], 0), (["--cfg", "job"], 0), (["nosuch"], 2):
                sys.argv = [program, *flags]
                try:
                    runpy.run_path(program, run_name="__main__")
                except SystemExit as stop:
                    assert (stop.code or 0) == code, (program, flags, stop.code)
        print(sorted({name.split(".")[0] for name in sys.modules} & {"torch", "torchvision", "torchmetrics"}))
    """
    env = {**os.environ, "COMP_LINE": "python train.py lo"}
    result = subprocess.run([sys.executable, "-c", code, *PROGRAMS], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "[]", result.stdout[-300:]
