# Two commands do everything on a fresh machine: `make demo` and `make test`.
#   make demo TORCH=cpu   takes torch's CPU-only wheels (no CUDA download) from PyTorch's CPU index
# Switching TORCH on an existing .venv: `make clean-venv` first.
PYTHON ?= python3
TORCH  ?= default
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PIP    := $(PY) -m pip install -q -c constraints.txt
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test venv clean clean-venv

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
	$(PY) -m pytest -q tests

clean:
	rm -rf runs .pytest_cache

clean-venv:
	rm -rf $(VENV)
