# beam_dp: two commands. `make demo` and `make test` each create/update .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# pytest workers: 2 by default (CI has 2 cores)
JOBS ?= 2

.PHONY: demo test venv install install-test bench clean flink-test

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

# the demo install holds every tool the README shows, the lifelong job's torch (CPU build) included
$(VENV)/.installed: $(VENV)/.created setup.py
	$(PIP) install --quiet -e '.[torch]'
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

## Run the whole test suite (TESTS selects a part by hand, e.g. TESTS="-m 'not slow'").
TESTS ?=
test: install-test
	$(PY) -m pytest -q -n $(JOBS) $(TESTS) tests

## Native Flink: its own venv (PyFlink pins apache-beam<=2.61, pyarrow<21), then a real local Flink job.
FLINK_VENV ?= .venv-flink
$(FLINK_VENV)/.installed: beam_dp/flink/requirements.txt
	$(PYTHON) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/pip install --quiet --upgrade pip
	$(FLINK_VENV)/bin/pip install --quiet -r beam_dp/flink/requirements.txt
	touch $@

# the parity test runs the Beam path in the main venv (Beam 2.77) beside the Flink job; the slow cluster
# test (tests/flink/test_flink_cluster.py) starts a standalone JobManager + TaskManager (needs Java; ~1 min).
# FLINK_TESTS selects a part by hand (e.g. FLINK_TESTS="-m 'not slow'").
FLINK_TESTS ?=
flink-test: $(FLINK_VENV)/.installed install-test
	PYTHONPATH=$(CURDIR) $(FLINK_VENV)/bin/python -m pytest -q -p no:cacheprovider $(FLINK_TESTS) tests/flink

## Benchmarks (by hand; results go to docs/).
bench: install
	$(PY) benchmarks/bench_continual_sum.py

clean:
	rm -rf $(VENV) $(FLINK_VENV) output build *.egg-info .pytest_cache
