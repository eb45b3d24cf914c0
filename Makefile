# The two commands of the README: `make demo` and `make test`; `make check` (lint, format,
# types, layers) runs before the tests in CI; `make test-fast` is the edit-test loop.
# The virtualenv: $PVM_VENV if set (as the README says), else ~/.cache/pvm/venv.
VENV ?= $(or $(PVM_VENV),$(HOME)/.cache/pvm/venv)
export PVM_VENV := $(VENV)
# pytest-xdist workers of make test: the Spark tests share one (one session JVM, --dist
# loadgroup and their xdist_group in tests/conftest.py), the rest spread over all
WORKERS ?= 2

.PHONY: setup demo test test-fast check format
setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/pvm demo

test: setup
	@bash scripts/test_tools.sh
	@bash scripts/services.sh
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadgroup --durations=30

# no Spark, no database servers: a few minutes
test-fast: setup
	@bash scripts/test_tools.sh
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(WORKERS) -m "not spark and not servers"

check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
