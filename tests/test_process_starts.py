"""A process's start imports what it uses, not what a neighbour of it might.

Every worker, `relayq` command and API server pays for its imports at each start (the
suite starts hundreds). These libraries are each a tenth of a second or more, and wait
for the code that needs them: Alembic for a store behind `store.migrate.HEAD`, aiohttp
for the first model, httpx for a webfetch or a webhook, Flower for `relayq flower`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_WORKERS = "runpy.run_module('workers', run_name='__main__')"
LATER = ["aiohttp", "alembic", "flower", "httpx", "regex", "tornado"]

# The top-level packages of LATER a process holds once `start` has run.
PROBE = """
import json, runpy, sys
try:
    {start}
except SystemExit:
    pass
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({later!r}))))
"""


def loaded_by(start: str, tmp_path: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAYQ_")}
    env |= {
        "RELAYQ_HOME": str(tmp_path),
        # Named, so that `--help` starts no embedded broker; nothing connects to it.
        "RELAYQ_BROKER_URL": "redis://127.0.0.1:1/0",
        "RELAYQ_AGENTS": "tests.durable.agents",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(start=start, later=LATER)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "start",
    [
        # `python -m workers worker --help`: through Celery's own worker command
        f"sys.argv = ['workers', 'worker', '--help']; {RUN_WORKERS}",
        f"sys.argv = ['workers', 'beat', '--help']; {RUN_WORKERS}",
        "import cli.main",
        "import api.app",
    ],
    ids=["worker", "beat", "cli", "api"],
)
def test_a_process_start_imports_none_of_the_libraries_it_may_never_use(start: str, tmp_path: Path):
    assert loaded_by(start, tmp_path) == []


def test_the_probe_sees_a_library_once_it_is_imported(tmp_path: Path):
    assert loaded_by("import store.migrate; import alembic.command", tmp_path) == ["alembic"]
