# Quick start: `make demo` runs the main job; `make test` runs the whole suite (what CI runs);
# `make check` runs the fast tier (every package, no test marked slow) in under 3 minutes.
# Both create .venv if missing and reinstall only when pyproject.toml changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: install demo test check test-order bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,s3,trackers,browser]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m flows.demo

# Two pytest workers, each test file whole on one of them (module fixtures start once), the
# files in collection order, those holding slow tests first (tests/conftest.py), so that
# the short files fill in at the end; TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25
# The project's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set, each of the
# suite's ~150 Python subprocesses would compile the modules it imports again.
COMPILE := $(BIN)/python -m compileall -q pipeline storage_schema jobs flows tests benchmarks

test: $(STAMP)
	$(COMPILE)
	$(PYTEST)

check: $(STAMP)
	$(COMPILE)
	$(PYTEST) -m "not slow"

# The test files whose flows share the session's Prefect API (tests/conftest.py's
# prefect_harness), in the reverse of pytest's order, in one process: every test must find
# its own runs whatever ran before it (found by their fixtures; tests/code/test_test_order.py
# checks the target runs every one of them, reversed).
# .ci/run runs its fast tier after `make test`; ORDER_MARK= runs the slow tests too.
PREFECT_TESTS = $(shell grep -rlE --include='test_*.py' '\b(prefect_harness|prefect_api)\b' tests \
	| grep -v '^tests/code/' | LC_ALL=C sort -r)
ORDER_MARK ?= not slow

test-order: $(STAMP)
	$(COMPILE)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "$(ORDER_MARK)" $(PREFECT_TESTS)

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_protocols.py --markdown
	$(BIN)/python benchmarks/bench_scale.py --markdown
	$(BIN)/python benchmarks/bench_extraction.py --markdown
	$(BIN)/python benchmarks/bench_orchestration.py --markdown
	$(BIN)/python benchmarks/bench_load.py --cells 1000
	$(BIN)/python benchmarks/bench_datasets.py
	$(BIN)/python benchmarks/bench_early.py --markdown

clean:
	rm -rf $(VENV) repeval-store demo-out bench-early-out .pytest_cache
