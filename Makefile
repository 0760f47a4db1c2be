# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-latest versions demo lint typecheck pytest lock clean

# Every package at the exact version requirements/dev.lock names, so a release upstream
# cannot turn main red between two days; `make lock` moves the lock to the newest
# versions pyproject.toml's ranges allow, and `make test-latest` tries them unlocked.
LOCK := requirements/dev.lock
PIP_VERSION := 26.3

# pip's and the build backend's output (setuptools' deprecation boxes among it) goes to
# $(INSTALL_LOG); the terminal gets one line, or the log's tail if the install fails.
INSTALL_LOG := $(VENV)/install.log
# LOCKED=0 (make test-latest) installs the newest releases the ranges allow instead.
LOCKED ?= 1
ifeq ($(LOCKED),1)
INSTALL_FROM := from $(LOCK)
INSTALL := $(BIN)/python -m pip install -r $(LOCK) && $(BIN)/python -m pip install --no-deps -e .
else
INSTALL_FROM := unlocked, the newest releases
INSTALL := $(BIN)/python -m pip install --upgrade --upgrade-strategy eager -e '.[dev]'
endif

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing relayq and its dependencies into $(VENV), $(INSTALL_FROM) (output in $(INSTALL_LOG)) ..."
	@{ $(BIN)/python -m pip install pip==$(PIP_VERSION) && $(INSTALL); } > $(INSTALL_LOG) 2>&1 \
	  || { tail -n 40 $(INSTALL_LOG); echo "make: the install failed; all of it is in $(INSTALL_LOG)"; exit 1; }
	@touch $(STAMP)

# A red run names what it ran on: the versions of the parts a new release could break.
VERSIONED := celery kombu redis SQLAlchemy sqlmodel pydantic fastapi uvicorn flower psycopg
versions: $(STAMP)
	@$(BIN)/python -c 'import sys; from importlib.metadata import version; \
	  print("versions:", ", ".join(f"{n} {version(n)}" for n in sys.argv[1:]))' $(VERSIONED)

# mypy (40 CPU-s) checks the code while the suite runs, which waits on processes more than
# it computes; its report follows the suite's, and either failing fails `make test`.
test: versions lint $(STAMP)
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
# slowest 20 tests. Five lanes on two cores: 580 s of tests, against 647 s on six and
# 701 s on four (2026-12-06, 2,838 tests; 482 s on five once tests/conftest.py froze
# each module's survivors out of the lanes' collections).
TEST_WORKERS ?= 5
TS_CLIENTS := tests/clients/typescript
TS_STAMP := $(TS_CLIENTS)/node_modules/.installed

# Each lane, and each process the suite starts, imports relayq and the test modules: they
# are compiled once, into __pycache__ (ignored by git), whatever PYTHONDONTWRITEBYTECODE
# says outside, not once in every process (collecting the suite: 12 CPU-s against 5).
pytest: $(STAMP) $(TS_STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20

# An MCP client nobody here wrote, the official TypeScript SDK's (tests/clients/typescript):
# its packages, at the versions its lock names, for the tests marked `node`. A failed
# install fails `make test`; with no npm at all those tests skip, or fail where
# RELAYQ_REQUIRE names node (CI).
$(TS_STAMP): $(TS_CLIENTS)/package.json $(TS_CLIENTS)/package-lock.json
	@if command -v npm >/dev/null; then \
	  echo "installing the TypeScript SDK's MCP client into $(TS_CLIENTS) (output in $(VENV)/npm.log) ..."; \
	  (cd $(TS_CLIENTS) && npm ci --no-audit --no-fund) > $(VENV)/npm.log 2>&1 \
	    || { tail -n 30 $(VENV)/npm.log; echo "make: npm ci failed in $(TS_CLIENTS)"; exit 1; }; \
	  touch $@; \
	else echo "make: no npm here: the TypeScript MCP client's tests will skip (install nodejs and npm)"; fi

# `make demo DEMO=--keep` keeps the worker, the API and Flower running afterwards.
demo: $(STAMP)
	@$(BIN)/relayq demo $(DEMO)

# The newest releases, unlocked, in a venv of their own: what a new user's install takes.
test-latest:
	@rm -f .venv-latest/.installed
	@$(MAKE) --no-print-directory test VENV=.venv-latest LOCKED=0

# pip-tools' pip-compile, in a venv of its own, reading pip's own configuration (indexes,
# find-links); relayq's own line (the dev extra names relayq) is left out of the lock.
# Commit a refreshed lock only together with a green `make test`.
lock:
	@test -x .venv-lock/bin/pip-compile || { $(PYTHON) -m venv .venv-lock \
	  && .venv-lock/bin/python -m pip install -q pip==$(PIP_VERSION) pip-tools; }
	.venv-lock/bin/pip-compile --quiet --upgrade --extra dev --strip-extras --allow-unsafe \
	  --no-emit-index-url --no-emit-find-links --no-header -o $(LOCK) pyproject.toml
	@sed -i '/^relayq @ /,/^    # via relayq/d' $(LOCK)
	@echo "make: $(LOCK) refreshed; run make test before committing it"

clean:
	rm -rf $(VENV) .venv-latest .venv-lock .relayq .pytest_cache .mypy_cache .ruff_cache $(TS_CLIENTS)/node_modules
