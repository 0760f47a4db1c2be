"""`relayq demo`, end to end, as a new user runs it: processes, a batch, approvals by API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relayq.demo import lookup_order
from store import Database, list_requests
from tests.durable.conftest import Broker

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_demo_runs_twenty_jobs_answers_their_approvals_by_api_and_stops_everything(
    tmp_path: Path, broker: Broker
):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAYQ_")}
    env["PYTHONPATH"] = str(ROOT)
    if not broker.url.startswith("redis+socket"):  # the machine's Redis, on the tests' db
        env["RELAYQ_BROKER_URL"] = broker.url
        env["RELAYQ_KEY_PREFIX"] = broker.new_prefix()

    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    home = tmp_path / ".relayq" / "demo"
    results = [json.loads(line) for line in (home / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in results] == [f"job-{n:02d}" for n in range(1, 21)]
    assert {r["status"] for r in results} == {"done"}
    # The back-office policy: up to 150 approved, above declined, job by job.
    for n, r in enumerate(results):
        amount = json.loads(lookup_order({"order": str(1001 + n)}, None))["amount"]  # type: ignore[arg-type]
        expected = "refund made" if amount <= 150 else "refund not made"
        assert r["text"].startswith(f"Order {1001 + n}: {expected}"), r
    db = Database(f"sqlite:///{home / 'relayq.db'}")
    answered = list_requests(db, status=None, limit=100)
    db.dispose()
    assert len(answered) == 20
    assert {r.status for r in answered} == {"answered"}
    assert {r.answered_by for r in answered} == {"backoffice"}
    assert "20 jobs: 20 done" in done.stdout
    assert "approvals waiting" in done.stdout
    assert _processes_with(f"RELAYQ_HOME={home}") == [], "every process the demo started stopped"


def _processes_with(setting: str) -> list[int]:
    """Live processes whose environment holds `setting`."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if setting.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found
