# Two commands do all the set-up on a fresh machine (Python >= 3.10 with venv, and make):
#   make train [ARGS="loss=hinge optim.lr=1e-4"]   install into .venv, then train on the built-in digits
#   make test  [PYTEST_ARGS=...]                   install into .venv, then the fast tier: every test not marked
#                                                  slow, in process, one pytest-xdist worker per core
#   make test-slow                                 the tests marked slow: where a process is the point (signals,
#                                                  kill, torchrun, file-size limits, the notebook's kernel)
#   make lint                                      ruff lint and format check (CI runs it before the tests)
#   make test-slurm                                as root: a one-node SLURM cluster on this machine
#                                                  (scripts/local_slurm.sh), tests/test_slurm.py, then stops it
# Versions come from constraints.txt, the one place where tested versions are pinned.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SLURM_STAMP := $(VENV)/.installed-slurm

.PHONY: install train test test-slow lint test-slurm

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python train.py $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -n auto --dist loadfile $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# the slurm extra (hydra-submitit-launcher) on top of the test install
$(SLURM_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,slurm]'
	touch $(SLURM_STAMP)

# tests/test_slurm.py: the tests marked `slurm`, and its checks of the launcher config and of submitit's
# signal, which need the extra but no cluster. The cluster is stopped whether the tests pass or not, and
# the tests' exit status is make's. The requeue timelines they log are shown (log_cli): docs/scaling.md
# quotes them.
test-slurm: $(SLURM_STAMP)
	bash scripts/local_slurm.sh start
	$(BIN)/python -m pytest tests/test_slurm.py -o log_cli=true -o log_cli_level=INFO $(PYTEST_ARGS); \
		status=$$?; bash scripts/local_slurm.sh stop; exit $$status
