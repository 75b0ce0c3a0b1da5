# make train   -> a virtualenv with everything, then python -m hydra_raytrain (ARGS="model=mlp ..." to override)
# make test    -> the same virtualenv, then make lint and the gate: every test but the long tier (PYTEST_ARGS="-k sampler")
# make test-long -> the long tier (tests marked long: the variants of capabilities the gate already runs end to end)
# make test-all -> make lint, then both tiers
# make test-fast -> the unit tier only (no Ray cluster), in one to two minutes
# make lint    -> ruff (lint + format check) and mypy on the package
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install train lint test test-long test-all test-fast bench bench-gpu bench-sweep bench-commands bench-checkpoint bench-memory bench-streaming bench-predict bench-serve bench-loader bench-text clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt torch torchvision
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,tensorboard,lint,lightning]'
	touch $(STAMP)

install: $(STAMP)

train: install
	$(BIN)/python -m hydra_raytrain $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# --durations: the slowest tests at the end of every run, so that a gate growing past its budget shows where.
# The unit tier starts no cluster and runs on every core (pytest-xdist); the integration tier shares one Ray cluster
# that already uses them all, so it runs in one process.
# PYTEST_ARGS reach both (-k, -x; -n 0 for --pdb); pytest's exit 5, no test of a tier selected, is not a failure.
UNIT        := $(BIN)/python -m pytest tests/unit -n auto --dist worksteal --durations=15
INTEGRATION := $(BIN)/python -m pytest tests/integration --durations=15
SELECTED    := || [ $$? -eq 5 ]

test: lint
	$(UNIT) -m "not long" $(PYTEST_ARGS) $(SELECTED)
	$(INTEGRATION) -m "not long" $(PYTEST_ARGS) $(SELECTED)

test-long: install
	$(BIN)/python -m pytest -m long --durations=15 $(PYTEST_ARGS)

test-all: lint
	$(UNIT) $(PYTEST_ARGS) $(SELECTED)
	$(INTEGRATION) $(PYTEST_ARGS) $(SELECTED)

test-fast: install
	$(UNIT) -m "not slow" $(PYTEST_ARGS)

bench: install
	$(BIN)/python benchmarks/throughput.py

bench-gpu: install
	$(BIN)/python benchmarks/throughput.py --gpu

bench-sweep: install
	$(BIN)/python benchmarks/sweep.py

bench-commands: install
	$(BIN)/python benchmarks/commands.py

bench-checkpoint: install
	$(BIN)/python benchmarks/checkpoint_upload.py

bench-memory: install
	$(BIN)/python benchmarks/memory.py

bench-streaming: install
	$(BIN)/python benchmarks/streaming.py

bench-predict: install
	$(BIN)/python benchmarks/predict.py

bench-serve: install
	$(BIN)/python benchmarks/serve.py

bench-text: install
	$(BIN)/pip install --quiet -c constraints.txt -e '.[bench]'
	$(BIN)/python benchmarks/text.py $(ARGS)

bench-loader: install
	$(BIN)/python benchmarks/loader.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
