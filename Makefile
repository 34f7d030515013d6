# simplan: the two commands a new user needs.
#   make demo   set up, then run the whole pipeline on the embedded default model (SmolLM2-135M)
#   make test   set up, then lint and run the tests (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint format

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m simplan.scripts.cli pipeline --config recipes/pipeline/twx-smollm2.yaml

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q -m "not slow" tests

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
