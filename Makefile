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

# mypy (40 CPU-s) checks the code while the suite runs, which waits on processes more than
# it computes; its report follows the suite's, and either failing fails `make test`.
test: lint $(STAMP)
	@$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & types=$$!; \
	$(MAKE) --no-print-directory pytest; tests=$$?; \
	wait $$types; typed=$$?; echo "$(BIN)/mypy"; cat $(VENV)/mypy.log; \
	exit $$(( tests != 0 ? tests : typed ))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite runs on TEST_WORKERS pytest-xdist lanes (tests/lanes.py): much of it waits on
# workers, brokers and browsers, not on a core. A module with costly module-wide parts keeps
# to one lane (ONE_LANE, tests/conftest.py); the long ones start first. It ends with its
# slowest 20 tests. Four lanes on two cores: 456 s of tests, against 803 s on two.
TEST_WORKERS ?= 4

# Each lane, and each process the suite starts, imports relayq and the test modules: they
# are compiled once, into __pycache__ (ignored by git), whatever PYTHONDONTWRITEBYTECODE
# says outside, not once in every process (collecting the suite: 12 CPU-s against 5).
pytest: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20

# `make demo DEMO=--keep` keeps the worker, the API and Flower running afterwards.
demo: $(STAMP)
	@$(BIN)/relayq demo $(DEMO)

clean:
	rm -rf $(VENV) .relayq .pytest_cache .mypy_cache .ruff_cache
