"""Hyper-parameter search with Optuna (hparams_search=optuna, the sweeps extra): the tiny search as documented; a
trial that ends without a score is recorded as failed and the study goes on; the study, stored in SQLite in the
sweep folder, resumes."""

from __future__ import annotations

import pytest
from conftest import run_train

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the sweeps extra (pip install '.[sweeps]')")
optuna = pytest.importorskip("optuna")

# two trials a launch; a trial with final_eval_samples=0 trains but measures nothing: a run without a score.
# 20,000 digits train a metrics classifier that passes its accuracy check (once: it is cached under data/).
SEARCH = (
    "hparams_search=optuna",
    "data.num_samples=20000",
    "hydra.sweeper.params=null",
    "hydra.sweeper.n_trials=2",
    "trainer.final_eval_samples=choice(0,100)",
)


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


@pytest.mark.slow  # four trainings and four evaluations
def test_the_tiny_search_completes_its_trials_as_typed(tmp_path, one_thread):
    typed = ("-m", "hparams_search=optuna", "debug=tiny", "hydra.sweeper.n_trials=4")  # docs/package.md
    result = run_train(*typed, tiny=False, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    (storage,) = (tmp_path / "outputs" / "multirun").glob("*/*/optuna.db")
    trials = optuna.load_study(study_name="dcgan", storage=f"sqlite:///{storage}").trials
    assert [trial.state.name for trial in trials] == ["COMPLETE"] * 4 and all(trial.value > 0 for trial in trials)
