# Set-up and checks. `make demo` and `make test` build everything they need from scratch.
PYTHON ?= python3
VENV := .venv
ORACLE := .venv-oracle
BIN := $(VENV)/bin
PIP_QUIET := --quiet --disable-pip-version-check
# The checkout on sys.path by a plain .pth line, as an installed copy is found: setuptools'
# default editable finder imports pathlib and more as Python starts, 20-30 ms of every command
# that a `pip install .` never pays (and the benchmarks would count).
EDITABLE := --config-settings editable_mode=compat
# The oracle: MXNet 1.9.1 runs only beside numpy<1.24; it is never a runtime dependency.
ORACLE_PACKAGES := mxnet==1.9.1 "numpy<1.24" "opencv-python-headless<4.11"
# NVIDIA DALI (CPU-only here) runs the training guide's fn.readers.mxnet recipe in tests.
DALI := .venv-dali
DALI_PACKAGES := nvidia-dali-cuda120==2.4.0 numpy

.PHONY: all venv oracle chromium test test-fast demo lint docs bench clean

all: test

# The package alone (enough for the demo), then the test tools on top.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(PIP_QUIET) -e . $(EDITABLE)
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(BIN)/pip install $(PIP_QUIET) -e '.[test]' $(EDITABLE)
	touch $@

$(ORACLE)/.installed:
	$(PYTHON) -m venv $(ORACLE)
	$(ORACLE)/bin/pip install $(PIP_QUIET) $(ORACLE_PACKAGES)
	touch $@

$(DALI)/.installed:
	$(PYTHON) -m venv $(DALI)
	$(DALI)/bin/pip install $(PIP_QUIET) $(DALI_PACKAGES)
	touch $@

venv: $(VENV)/.installed

oracle: $(ORACLE)/.installed

# Headless Chromium renders `rectool report` pages in tests/test_report.py: Debian's package,
# installed when missing (CI runs as root on a fresh machine).
chromium:
	@command -v chromium >/dev/null || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

# The suite runs in one pytest process a CPU core (pytest-xdist; at most 8): on 2 cores it takes
# a little over half the time of one process. `make test PYTEST_JOBS=0` runs it in this process alone.
PYTEST_JOBS ?= auto
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_JOBS) --maxprocesses 8

test: $(VENV)/.test-installed $(ORACLE)/.installed $(DALI)/.installed chromium
	RECTOOL_ORACLE_PYTHON=$(CURDIR)/$(ORACLE)/bin/python \
	RECTOOL_DALI_PYTHON=$(CURDIR)/$(DALI)/bin/python $(PYTEST)

# Everything but the MXNet oracle tests (they fail loudly without the oracle venv).
test-fast: $(VENV)/.test-installed chromium
	$(PYTEST) -m 'not oracle'

demo: $(VENV)/.installed
	$(BIN)/python -m rectool.demo demo-out

# mypy checks the typed modules, `[tool.mypy] files` in pyproject.toml (tests/test_typing.py).
lint: $(VENV)/.test-installed
	$(BIN)/ruff check rectool tests
	$(BIN)/ruff format --check rectool tests
	$(BIN)/mypy

# Regenerate every cogged page: docs/cli.md from the real --help output, the figures from
# docs/benchmarks.md (tests/benchmarks/figures.py), the emitted reader's size
# (tests/test_docs.py and tests/test_docs_figures.py check them).
COGGED = $(shell grep -l '\[\[\[cog' README.md docs/*.md)
docs: $(VENV)/.test-installed
	$(BIN)/cog -r -I tests/benchmarks $(COGGED)

bench: $(VENV)/.test-installed $(ORACLE)/.installed
	RECTOOL_ORACLE_PYTHON=$(CURDIR)/$(ORACLE)/bin/python $(BIN)/python tests/benchmarks/run_all.py

clean:
	rm -rf $(VENV) $(ORACLE) $(DALI) demo-out .pytest_cache .ruff_cache .hypothesis *.egg-info
