# Two commands do all the set-up on a fresh machine (Python >= 3.10 with venv, and make):
#   make train [ARGS="loss=hinge optim.lr=1e-4"]   install into .venv, then train on the built-in digits
#   make test  [PYTEST_ARGS="-m 'not slow'"]       install into .venv, then run the test suite
#   make lint                                      ruff lint and format check (CI runs it before the tests)
# Versions come from constraints.txt, the one place where tested versions are pinned.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install train test lint

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python train.py $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
