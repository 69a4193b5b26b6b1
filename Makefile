# beam_dp: two commands. `make demo` and `make test` each create/update .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# pytest workers: 2 by default (CI has 2 cores)
JOBS ?= 2

.PHONY: demo test venv install install-test bench clean

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

$(VENV)/.installed: $(VENV)/.created setup.py
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed setup.py
	$(PIP) install --quiet -e '.[test,torch]'
	touch $@

venv: $(VENV)/.created
install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

## Run the main job (continual_stats) on the embedded demo dataset.
demo: install
	$(PY) -m pipelines.continual_stats --output output/demo

## Run the whole test suite.
test: install-test
	$(PY) -m pytest -q -n $(JOBS) tests

## Benchmarks (by hand; results go to docs/).
bench: install
	$(PY) benchmarks/bench_continual_sum.py

clean:
	rm -rf $(VENV) output build *.egg-info .pytest_cache
