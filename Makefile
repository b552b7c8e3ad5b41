# Set-up and entry points.  `make demo` and `make test` build .venv on first use.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# openfhe's wheels hold a CPython 3.10 extension only, so the venv must be 3.10.
PYTHON310 ?= $(shell command -v python3.10 2>/dev/null \
	|| ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.10*/bin/python3.10 2>/dev/null | tail -n 1)

.PHONY: demo test lint docs bench clean

$(VENV)/.created:
	@if [ -z "$(PYTHON310)" ]; then \
		echo "fednorm needs CPython 3.10 (openfhe ships 3.10 wheels only)."; \
		echo "Install it (e.g. 'pyenv install 3.10') or set PYTHON310=/path/to/python3.10."; \
		exit 1; fi
	$(PYTHON310) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	touch $@

$(VENV)/.installed-dev: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The study's tests train models (train extra: torch) and the Flower tests run a local
# Flower deployment (flower extra), on top of dev; mnist adds the study's MNIST subset.
$(VENV)/.installed-test: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e '.[dev,train,flower,mnist]'
	touch $@

# Each method plain, then PPF (paper preset, the default algorithms: no bound on the data
# needed), each report beside the pooled fit; progress on stderr while a run is under way;
# at the end one screen: per method and privacy the worst error against pooled, rounds,
# bytes and seconds.
demo: $(VENV)/.installed-dev
	@$(VENV)/bin/fednorm demo --dataset bcw --parties 10 --preset paper

test: $(VENV)/.installed-test
	$(PY) -m pytest -q

# The API reference of the public API (fednorm and fednorm.flower), by pdoc, from the
# docstrings, into docs/api/ (index.html); fails on any pdoc warning and on a public name
# without a docstring (tests/test_docs.py builds it too, in CI).
$(VENV)/.installed-docs: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e '.[dev,flower]'
	touch $@

docs: $(VENV)/.installed-docs
	$(PY) docs/build_api.py docs/api

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .

# The bench times the study's grid too (train extra: torch), and its plots need matplotlib
# (part of the train extra).
$(VENV)/.installed-bench: $(VENV)/.created pyproject.toml
	$(PY) -m pip install -q -e '.[dev,train]'
	touch $@

# The benchmark report against the paper (~2 h on a quiet 2-core machine, most of it the
# study's tabular grid; BENCH_ARGS="--sections ..." runs a subset): rewrites
# bench/RESULTS.md (the generated report alone) and bench/plots/.
bench: $(VENV)/.installed-bench
	$(VENV)/bin/fednorm bench --results bench/RESULTS.md --plots bench/plots $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
