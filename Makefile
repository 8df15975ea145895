# Two commands do everything on a fresh machine: `make demo` and `make test` (`make test-fast` skips the slow tests;
# `make lint` runs ruff, `make typecheck` mypy on the public API, both with pyproject.toml's settings).
#   make demo TORCH=cpu   takes torch's CPU-only wheels (no CUDA download) from PyTorch's CPU index
# Switching TORCH on an existing .venv: `make clean-venv` first.
PYTHON ?= python3
TORCH  ?= default
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PIP    := $(PY) -m pip install -q --no-compile -c constraints.txt
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test test-fast lint typecheck venv clean clean-venv

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifeq ($(TORCH),cpu)
	$(PIP) torch torchvision --index-url $(TORCH_CPU_INDEX)
endif
	$(PIP) -e '.[test]'
	$(PY) -m compileall -q -j 0 -x "/tests?/" $(VENV)/lib > /dev/null 2>&1 || true  # see SITE_BYTECODE below
	touch $(STAMP)

# SITE_BYTECODE: pip compiles what it installs one file at a time (~2 min here of a 3.7 min set-up); installed with
# --no-compile and compiled by compileall on every core, the set-up took 2.5 min. The packages' own test suites (a
# fifth of the files, which raysim does not import) are left out; a few of them do not compile on this Python (py312
# syntax), as pip's compile step skips them too: `|| true`.

# raysim's own bytecode, written once: pip compiles what it installs, but not an editable source tree, and where
# PYTHONDONTWRITEBYTECODE is set every process (each Ray worker, Tune trial and CLI a test starts) compiled raysim's
# ~70 modules again on import (0.3-0.4 s of CPU each). compileall writes whatever that variable says; stale files
# are recompiled in memory, never trusted.
BYTECODE = $(PY) -m compileall -q -j 0 -x "/[.]" raysim tests benchmarks examples > /dev/null

venv: $(STAMP)

demo: $(STAMP)
	$(BYTECODE)
	$(VENV)/bin/raysim run experiments/default.yaml

# pytest-xdist runs the files on TEST_WORKERS processes (each with its own local Ray): the fault, sweep and
# cluster tests wait on processes and signals about half the time, so 2 keep this 2-core machine's cores busy
# (measured from a fresh clone: tests 533 s against 636 s in one process). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests $(PYTEST_ARGS)

# the edit-test loop: everything but the tests marked slow (whole experiments, sweeps, subprocesses)
test-fast: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check

# mypy on the public API (pyproject.toml [tool.mypy] lists the files)
typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf runs .pytest_cache

clean-venv:
	rm -rf $(VENV)
