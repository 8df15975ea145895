# Two commands do everything on a fresh machine: `make demo` and `make test` (`make test-fast` skips the slow tests;
# `make lint` runs ruff, `make typecheck` mypy on the public API, both with pyproject.toml's settings).
#   make demo TORCH=cpu   takes torch's CPU-only wheels (no CUDA download) from PyTorch's CPU index
# Switching TORCH on an existing .venv: `make clean-venv` first.
PYTHON ?= python3
TORCH  ?= default
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PIP    := $(PY) -m pip install -q -c constraints.txt
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test test-fast lint typecheck venv clean clean-venv

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifeq ($(TORCH),cpu)
	$(PIP) torch torchvision --index-url $(TORCH_CPU_INDEX)
endif
	$(PIP) -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/raysim run experiments/default.yaml

test: $(STAMP)
	$(PY) -m pytest -q tests $(PYTEST_ARGS)

# the edit-test loop: everything but the tests marked slow (whole experiments, sweeps, subprocesses)
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check

# mypy on the public API (pyproject.toml [tool.mypy] lists the files)
typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf runs .pytest_cache

clean-venv:
	rm -rf $(VENV)
