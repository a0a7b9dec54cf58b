# Two commands: `make demo` and `make test`. Everything else is set up by them.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
PYTEST_ARGS ?=
# make test runs the suite on this many pytest-xdist workers, each with its own servers on free ports.
# Three on the 2-core machine: a sixth of the workers' time is waiting (Ray's tasks, timeouts,
# throttled links), which a third worker fills (two: 21 min; three: under 20; docs/development.md).
TEST_WORKERS ?= 3
AZURITE := $(abspath $(VENV))/azurite/node_modules/.bin/azurite-blob

# The inner loop: the pure-logic tests (orders, resume states, mixtures, codec, names, secrets,
# budgets), no emulator, about 1.5 minutes on 2 cores. `make test` remains the whole suite.
FAST_TESTS := tests/test_permutation.py tests/test_sampler.py tests/test_read_options.py \
	tests/test_shuffle_modes.py tests/test_state_contract.py tests/test_mixture_properties.py \
	tests/test_codec.py tests/test_names.py tests/test_manifest_codec.py tests/test_manifest_validation.py \
	tests/test_pages.py tests/test_readorder.py tests/test_element_edges.py tests/test_secrets.py tests/test_budget.py

.PHONY: demo test test-fast lint typecheck bench bench-quick clean docs

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(VENV)/bin/python setup.cfg pyproject.toml
	$(PIP) install -q -e '.[tf,yaml]'
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install -q -e '.[all,dev,docs]' 'torch==2.13.0'
	# The reference implementation the sampler's order is checked against (pure-Python parts only).
	$(PIP) install -q --no-deps 'yogadl==0.1.4'
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/quickstart.py

# Azurite, Azure's storage emulator, for the Azure backend's tests (Node 20 and npm).
$(VENV)/azurite/.installed: $(VENV)/bin/python
	npm install --prefix $(VENV)/azurite azurite@3 --no-audit --no-fund --loglevel=error
	touch $@

# Everything: on pytest-xdist's workers, then the timing-sensitive tests alone (the "serial"
# marker in pyproject.toml), collected from the files that use it only (collecting the whole
# suite again took 25 s).
SERIAL_TESTS = $(shell grep -rl --include='*.py' 'pytest.mark.serial' tests)
test: $(VENV)/.installed-dev $(VENV)/azurite/.installed
	AZURITE_BLOB=$(AZURITE) $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS)
	AZURITE_BLOB=$(AZURITE) $(PY) -m pytest -m serial $(or $(SERIAL_TESTS),tests) $(PYTEST_ARGS)

test-fast: $(VENV)/.installed-dev
	$(PY) -m pytest -q -m "not slow" $(FAST_TESTS) $(PYTEST_ARGS)

# The documentation site, strictly (a warning, a broken link or anchor fails it), into site/.
# make test builds it too, and loads every page in headless Chromium (tests/test_docs_site.py).
docs: $(VENV)/.installed-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

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
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache
