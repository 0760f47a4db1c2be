# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck pytest clean

# pip's and the build backend's output (setuptools' deprecation boxes among it) goes to
# $(INSTALL_LOG); the terminal gets one line, or the log's tail if the install fails.
INSTALL_LOG := $(VENV)/install.log

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing relayq and its dependencies into $(VENV) (output in $(INSTALL_LOG)) ..."
	@{ $(BIN)/python -m pip install --upgrade pip \
	  && $(BIN)/python -m pip install -e '.[dev]'; } > $(INSTALL_LOG) 2>&1 \
	  || { tail -n 40 $(INSTALL_LOG); echo "make: the install failed; all of it is in $(INSTALL_LOG)"; exit 1; }
	@touch $(STAMP)

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite runs on TEST_WORKERS pytest-xdist lanes (tests/lanes.py): much of it waits on
# workers, brokers and browsers, not on a core. A module with costly module-wide parts keeps
# to one lane (ONE_LANE, tests/conftest.py). It ends with its slowest 20 tests.
# Two lanes, one per core, until the suite burns less CPU: six ran 2.3x faster than one
# (894 s against 2,031 s) but at three lanes to a core some tests missed their deadlines.
TEST_WORKERS ?= 2

pytest: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20

# `make demo DEMO=--keep` keeps the worker, the API and Flower running afterwards.
demo: $(STAMP)
	@$(BIN)/relayq demo $(DEMO)

clean:
	rm -rf $(VENV) .relayq .pytest_cache .mypy_cache .ruff_cache
