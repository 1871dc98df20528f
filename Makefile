# `make run`: the quickstart; `make test`: lint + tests (`make test-all`: every test, as CI
# runs them). Each creates .venv and installs if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# A CPU-only torch, without the NVIDIA CUDA libraries PyPI's torch brings (3.2 GB of a 6.4 GB
# .venv): `make run TORCH_INDEX=https://download.pytorch.org/whl/cpu`, where that index is
# reachable; torch and torchvision come from it, then the rest from PyPI.
TORCH_INDEX ?=

.PHONY: run test test-all lint bench gpu-wheels gpu-check docker-check slurm-check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install -q torch torchvision --index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The quickstart study: 10 Optuna trials on digits (each an MLflow run), then the best trial and
# how to browse it (`accel best` prints the link). Running it again resumes the study with 10 more
# trials.
run: $(STAMP)
	$(BIN)/accel tune
	$(BIN)/accel best --study quickstart --brief

lint: $(STAMP)
	$(BIN)/ruff check .

# `test`: every behaviour at least once, under ten minutes on 2 cores: the tests not marked
# `slow`. `test-all` (what CI runs, .ci/run): every test but the `gpu` ones, the `slow` ones too
# (real CIFAR-10 in ../shared/data, and the costlier variants of what `test` covers). Two
# pytest-xdist processes, a test file each at a time (a file's shared studies are made once), one
# OpenMP thread each, the costliest files first (tests/conftest.py: COSTLY_FIRST; xdist's own
# order, files with the most tests first, would leave them for last).
PYTEST_XDIST := -n 2 --dist loadfile --no-loadscope-reorder
# The suite's scratch files (stores, journals, checkpoints) on a RAM disk where the machine has
# one: a SQLite commit or a checkpoint written there waits for no disk.
TEST_TMP := $(shell test -d /dev/shm -a -w /dev/shm && echo TMPDIR=/dev/shm)

test: lint
	$(TEST_TMP) $(BIN)/pytest -m "not slow and not gpu" $(PYTEST_XDIST)

test-all: lint
	$(TEST_TMP) $(BIN)/pytest -m "not gpu" $(PYTEST_XDIST)

bench: $(STAMP)
	for b in engine_overhead amp_cpu tracking_overhead cli_startup; do $(BIN)/python bench/$$b.py; done

# The GPU check (checks/gpu/). Where pip reaches the registries: fill .gpu/ (git-ignored) with the
# wheels the GPU machine's python3 lacks, pinned to .venv, and the CIFAR-10 tarball, within the
# 64 MiB the GPU machine takes with the working tree. There, with .gpu/ in the working tree:
# `make gpu-check OUT=$OUT`, run by the machine's own python3 (torch with CUDA), not .venv; it
# writes $OUT/gpu_check.md and logs.
gpu-wheels: $(STAMP)
	$(BIN)/python -m checks.gpu --prepare

gpu-check:
	$(PYTHON) -m checks.gpu $(or $(OUT),$(error gpu-check needs OUT=<folder>)) $(if $(STEPS),--steps $(STEPS))

# The docker/ stack built and run (checks/docker/): needs docker (root starts dockerd if none
# runs), downloads gigabytes the first time; not part of `make test`.
docker-check: $(STAMP)
	$(BIN)/python -m checks.docker

# A study as a 2-task Slurm job array on a one-node Slurm made from Debian's slurm-wlm and munge
# (installed when missing), a task requeued mid-epoch, then everything stopped and removed
# (checks/slurm/): needs root; not part of `make test`.
slurm-check: $(STAMP)
	$(BIN)/python -m checks.slurm

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
