# The two commands of the README: `make demo` and `make test`.
# The virtualenv: $PVM_VENV if set (as the README says), else ~/.cache/pvm/venv.
VENV ?= $(or $(PVM_VENV),$(HOME)/.cache/pvm/venv)
export PVM_VENV := $(VENV)

.PHONY: setup demo test
setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/pvm demo

test: setup
	@bash scripts/services.sh
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider
