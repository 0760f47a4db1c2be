"""Every `redis.asyncio` client relayq opens is closed on every path (issue 36).

redis-py 8.2 reports a connection dropped open with a ResourceWarning, which
`filterwarnings = error` turned into a failure of whatever test was running when the
collector found it. The probe (`tests.durable.connection_probe`) runs in a process of
its own, so what it counts is its own: 1,000 clients opened and closed, one client used
from 200 event loops, a limiter and a circuit through a broker restart.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from relayq import RunResult
from tasks import DurableClient
from tests.forkserver import ROOT
from tests.ports import free_port

from .conftest import SQLITE_ONLY, SpareWorkers


# Redis connections are the subject, whatever the store: on PostgreSQL the probe's 1,000
# clients each open a database engine too (60 s against SQLite's 18).
@SQLITE_ONLY
@pytest.mark.timeout(300)
def test_no_redis_connection_outlives_its_client_loop_or_broker(
    spare_workers: SpareWorkers, tmp_path: Path
):
    # Given a worker of its own, and a run it finished
    spare = spare_workers.start()

    async def finished() -> RunResult:
        async with DurableClient(settings=spare.settings) as client:
            return await client.run("two-step", f"probe {uuid.uuid4().hex}", timeout=30)

    done = asyncio.run(finished())
    assert done.status == "done"
    assert done.run_id is not None

    # When the probe opens and closes its clients every way, in a process of its own
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "env": spare.env,
                "done_run": done.run_id,
                "agent": "two-step",
                "restart_port": free_port(),
                "folder": str(tmp_path / "redis"),
            }
        )
    )
    probe = subprocess.run(
        [sys.executable, "-m", "tests.durable.connection_probe", str(spec)],
        cwd=ROOT, env=spare.env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-4000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])

    # Then it holds the same sockets and Redis connections as before, and met no warning
    assert found["met"] == []
    assert found["after"] == found["before"]
