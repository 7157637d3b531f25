"""Optuna searches (hparams_search=optuna): a trial without a score fails and the study goes on, and resumes."""

from __future__ import annotations

import pytest
from conftest import in_process, run_train

import train

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the sweeps extra (pip install '.[sweeps]')")
optuna = pytest.importorskip("optuna")

# two trials a launch; a trial with final_eval_samples=0 trains but measures nothing: a run without a score.
# 20,000 digits train a metrics classifier that passes its accuracy check (once: it is cached under data/).
SEARCH = ("hparams_search=optuna", "data.num_samples=20000", "hydra.sweeper.params=null", "hydra.sweeper.n_trials=2")
SEARCH += ("trainer.final_eval_samples=choice(0,100)",)


@pytest.mark.slow
def test_a_search_fails_a_trial_without_a_score_goes_on_and_resumes_from_its_storage(tmp_path):
    sweep = tmp_path / "sweep"
    first = run_train("-m", *SEARCH, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    storage = f"sqlite:///{sweep / 'optuna.db'}"
    before = optuna.load_study(study_name="dcgan", storage=storage).trials
    # the TPE sampler's seed 0 draws 100, then 0: the second trial has no score
    assert [(t.state.name, t.params["trainer.final_eval_samples"]) for t in before] == [("COMPLETE", 100), ("FAIL", 0)]
    assert before[0].value > 0 and before[1].value is None

    # the same command into the same folder continues the stored study; another seed, or the seeded
    # sampler would draw its first points again
    resumed = run_train("-m", *SEARCH, f"hydra.sweep.dir={sweep}", "hydra.sweeper.sampler.seed=1", cwd=tmp_path)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    trials = optuna.load_study(study_name="dcgan", storage=storage).trials
    assert len(trials) == 4 and [t.params for t in trials[:2]] == [t.params for t in before]
    for trial in trials:  # failed exactly when the run had no score
        assert (trial.state.name == "FAIL") == (trial.params["trainer.final_eval_samples"] == 0), trial
    runs = sorted(sweep.glob("*_*/checkpoints/last.pt"))
    assert len(runs) == 4  # every trial trained, each in a folder of its own (job numbers restart at 0)


# a search that cannot run as asked: one paragraph, exit 2, before the study opens (gan/launch.py) ----------

QUICK = ("-m", "hparams_search=optuna", "debug=tiny", "hydra.sweeper.n_trials=1", "hydra.sweeper.n_jobs=1")
REFUSED = {  # overrides (STORE: the sweep folder's optuna.db) -> what the paragraph says
    "no trials": (["hydra.sweeper.n_trials=0"], "n_trials=0: the number of trials to run must be 1 or more"),
    "no jobs": (["hydra.sweeper.n_jobs=0"], "n_jobs=0: the number of trials asked for at once must be 1 or more"),
    "failure rate": (["hydra.sweeper.max_failure_rate=1.5"], "max_failure_rate=1.5 must be from 0 to 1"),
    "no study name": (["hydra.sweeper.study_name=null"], "study_name=None: a stored study needs a name"),
    "direction": (["hydra.sweeper.direction=maximize"], "direction=maximize: a trial returns its FID"),
    "unknown key": (["optim.lrr=interval(1e-4,2e-4)"], "Key 'lrr' not in 'OptimConfig'. Change hydra.sweeper.params"),
    "unknown option": (["loss=choice(bce,nope)"], "Could not find 'loss/nope'"),
    "wrong type": (["optim.beta1=choice(0.5,high)"], "optim.beta1=high"),
    "damaged storage": (["STORE=garbage"], "cannot be read as an SQLite database (file is not a database)"),
    "folder storage": (["STORE=folder"], "names a folder, where the study is kept in a file"),
    "no such folder": (["hydra.sweeper.storage=sqlite:////nowhere/x.db"], "the folder /nowhere does not exist"),
}


@pytest.mark.parametrize("overrides, says", REFUSED.values(), ids=REFUSED.keys())
def test_a_search_that_cannot_run_as_asked_is_refused_before_its_study_opens(tmp_path, overrides, says):
    sweep, store = tmp_path / "sweep", [o.split("=")[1] for o in overrides if o.startswith("STORE=")]
    if store:
        sweep.mkdir()
        (sweep / "optuna.db").mkdir() if store == ["folder"] else (sweep / "optuna.db").write_text("garbage" * 99)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    argv = [*QUICK, *(o for o in overrides if not o.startswith("STORE=")), f"hydra.sweep.dir={sweep}"]
    result = in_process(train.main, argv, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and says in output and "Nothing was written" in output, output[-2000:]
    assert "Traceback" not in output and sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_search_where_no_trial_scored_says_so_and_where_a_study_outside_its_folder_is(tmp_path):
    outside = tmp_path / "elsewhere.db"
    argv = [*QUICK, "trainer.final_eval_samples=0", f"hydra.sweep.dir={tmp_path / 's'}"]
    result = in_process(train.main, [*argv, f"hydra.sweeper.storage=sqlite:///{outside}"], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output, output[-2000:]
    assert "No trial of the search returned a score" in output and "trainer.final_eval_samples above 0" in output
    assert f"The study is stored in {outside}, outside the sweep folder" in output
    trials = optuna.load_study(study_name="dcgan", storage=f"sqlite:///{outside}").trials
    assert [t.state.name for t in trials] == ["FAIL"]  # told, not left RUNNING


@pytest.mark.slow  # four trainings and four evaluations
def test_the_tiny_search_completes_its_trials_as_typed(tmp_path, one_thread):
    typed = ("-m", "hparams_search=optuna", "debug=tiny", "hydra.sweeper.n_trials=4")  # docs/package.md
    result = run_train(*typed, tiny=False, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    (storage,) = (tmp_path / "outputs" / "multirun").glob("*/*/optuna.db")
    trials = optuna.load_study(study_name="dcgan", storage=f"sqlite:///{storage}").trials
    assert [trial.state.name for trial in trials] == ["COMPLETE"] * 4 and all(trial.value > 0 for trial in trials)
