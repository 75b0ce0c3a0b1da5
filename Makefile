# make train   -> a virtualenv with everything, then python -m hydra_raytrain (ARGS="model=mlp ..." to override)
# make test    -> the same virtualenv, then the whole test suite (PYTEST_ARGS="-k sampler" to narrow)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install train test bench bench-gpu bench-sweep clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt torch torchvision
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,tensorboard]'
	touch $(STAMP)

install: $(STAMP)

train: install
	$(BIN)/python -m hydra_raytrain $(ARGS)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install
	$(BIN)/python benchmarks/throughput.py

bench-gpu: install
	$(BIN)/python benchmarks/throughput.py --gpu

bench-sweep: install
	$(BIN)/python benchmarks/sweep.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
