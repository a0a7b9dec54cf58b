# Two commands: `make demo` and `make test`. Everything else is set up by them.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck bench bench-quick clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(VENV)/bin/python setup.cfg pyproject.toml
	$(PIP) install -q -e '.[tf,yaml]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -q -e '.[all,dev]' 'torch==2.13.0'
	# The reference implementation the sampler's order is checked against (pure-Python parts only).
	$(PIP) install -q --no-deps 'yogadl==0.1.4'
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/quickstart.py

# Azurite, Azure's storage emulator, for the Azure backend's tests (Node 20 and npm).
$(VENV)/azurite/.installed: $(VENV)/bin/python
	npm install --prefix $(VENV)/azurite azurite@3 --no-audit --no-fund --loglevel=error
	touch $@

test: $(VENV)/.installed-dev $(VENV)/azurite/.installed
	AZURITE_BLOB=$(abspath $(VENV))/azurite/node_modules/.bin/azurite-blob $(PY) -m pytest $(PYTEST_ARGS)

# Layers (import-linter contracts in pyproject.toml), style and types: run by .ci/run before the tests.
lint: $(VENV)/.installed-dev
	$(PY) -m ruff check yogacache tests examples benchmarks
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_core.py

bench-quick: $(VENV)/.installed
	$(PY) benchmarks/bench_core.py --quick

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
