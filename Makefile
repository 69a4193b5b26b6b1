# beam_dp: two commands. `make demo` and `make test` each create/update .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# pytest workers: 2 by default (CI has 2 cores)
JOBS ?= 2

.PHONY: demo test test-long lint venv install install-test bench clean flink-test flink-test-long lock shell

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	touch $@

# the demo install holds every tool the README shows, the lifelong job's torch (CPU build) included
# every install goes through the lock (constraints/main.txt): a new upstream release never changes what a
# fresh clone installs
LOCK := constraints/main.txt
FLINK_LOCK := constraints/flink.txt
$(VENV)/.installed: $(VENV)/.created setup.py $(LOCK)
	@echo "make: installing beam_dp and its locked dependencies into $(VENV) (a few minutes on a fresh machine)"
	$(PIP) install --quiet -c $(LOCK) -e '.[torch]'
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed setup.py $(LOCK)
	@echo "make: installing the test and lint tools (pytest, ruff, mypy) from $(LOCK)"
	$(PIP) install --quiet -c $(LOCK) -e '.[test,torch]'
	touch $@

venv: $(VENV)/.created
install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

## Run the main job (continual_stats) on the embedded demo dataset.
demo: install
	@echo "make: running the demo job (pipelines.continual_stats) into output/demo"
	$(PY) -m pipelines.continual_stats --output output/demo

## A shell with the venv active (python -m beam_dp.verify output/demo and the README's other commands).
shell: install
	@echo "make: a shell with $(VENV) active; 'exit' to leave"
	@. $(VENV)/bin/activate && exec $${SHELL:-/bin/sh}

## The linter (ruff) and the type checker (mypy) as configured in pyproject.toml.
lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

## Run the test suite but the runs marked long (TESTS selects a part by hand, e.g. TESTS="-k units").
TESTS ?=
test: install-test lint
	$(PY) -m pytest -q -n $(JOBS) -m "not long" $(TESTS) tests

## The runs left out of CI for its time budget (tests/long.txt; about 15 minutes on 2 cores).
test-long: install-test
	$(PY) -m pytest -q -n $(JOBS) -m long $(TESTS) tests

## Native Flink: its own venv (PyFlink pins apache-beam<=2.61, pyarrow<21), then a real local Flink job.
FLINK_VENV ?= .venv-flink
# the lifelong family on Flink: torch (the CPU build the lock pins, as in the main venv) and dp-accounting
FLINK_FAMILIES := torch==2.13.0 dp-accounting
$(FLINK_VENV)/.installed: beam_dp/flink/requirements.txt $(FLINK_LOCK)
	$(PYTHON) -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/pip install --quiet --upgrade pip
	$(FLINK_VENV)/bin/pip install --quiet -c $(FLINK_LOCK) -r beam_dp/flink/requirements.txt $(FLINK_FAMILIES)
	touch $@

# the parity tests run the Beam path in the main venv (Beam 2.77) beside the Flink job; the standalone-cluster
# tests (needs Java) are marked long and run under flink-test-long.
# FLINK_TESTS selects a part by hand (e.g. FLINK_TESTS="-m 'not slow'").
FLINK_TESTS ?=
flink-test: $(FLINK_VENV)/.installed install-test
	PYTHONPATH=$(CURDIR) $(FLINK_VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not long" $(FLINK_TESTS) tests/flink

## The standalone-cluster runs (kill, savepoint rescale, metrics, unit bounding) left out of CI for its time budget
## (minutes each on 2 cores).
flink-test-long: $(FLINK_VENV)/.installed install-test
	PYTHONPATH=$(CURDIR) $(FLINK_VENV)/bin/python -m pytest -q -p no:cacheprovider -m long tests/flink

## Benchmarks (by hand; results go to docs/).
bench: install
	$(PY) benchmarks/bench_continual_sum.py

## Re-resolve both locks from setup.py and beam_dp/flink/requirements.txt in throwaway venvs (review the diff).
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install --quiet -e '.[test,torch]'
	{ echo "# The main venv's lock (make demo, make test, .ci/run install through it: pip -c). Regenerate with"; \
	  echo "# 'make lock' after changing setup.py's requirements, and review the diff."; \
	  .venv-lock/bin/pip freeze --exclude-editable; } > $(LOCK)
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install --quiet -r beam_dp/flink/requirements.txt \
	  $(FLINK_FAMILIES)
	{ echo "# The Flink venv's lock (.venv-flink, make flink-test). Regenerate with 'make lock'."; \
	  .venv-lock/bin/pip freeze --exclude-editable; } > $(FLINK_LOCK)
	rm -rf .venv-lock

clean:
	rm -rf $(VENV) $(FLINK_VENV) output build *.egg-info .pytest_cache
