# One-command set-up: `make demo` runs the main job, `make test` runs the checks and the test suite.
# Both create .venv on first use, install a CPU build of torch when no NVIDIA GPU is present,
# then install this package with its dev extra.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CPU_TORCH ?= torch==2.13.0
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-fast lint format bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/python -m pip install -q "torch>=2.4,<3"; \
	else \
		$(BIN)/python -m pip install -q "$(CPU_TORCH)"; \
	fi
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: install
	$(BIN)/t3d-trl quickstart

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports  # the layers contract of pyproject.toml: no upward import

test: lint
	$(BIN)/python -m pytest -q tests

# The loop while working: every test but the slow ones (pipelines, benchmark scripts, several processes).
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" tests

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: install
	$(BIN)/python benchmarks/bench_generation.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
