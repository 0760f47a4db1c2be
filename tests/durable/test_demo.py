"""`relayq demo`, end to end, as a new user runs it: processes, a batch, approvals by API,
an edited amount, a quorum of two, and the webhooks the worker sent."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from relayq.demo import QUORUM_ABOVE, order_record
from store import Database, StoredRequest, decisions_of, list_requests, run_result
from store.webhooks import list_deliveries
from tests import forkserver
from tests.durable.conftest import Broker
from tests.processes import stop_group

ONE_LANE = True  # tests/conftest.py: the demo runs once for the module's tests
START_EARLY = True  # and its tests take long, so a lane takes them first

ROOT = Path(__file__).resolve().parents[2]

# The demo runs once for the module; the first test's timeout covers it.
pytestmark = pytest.mark.timeout(300)


@dataclass
class Demo:
    home: Path
    stdout: str
    stderr: str
    returncode: int
    db: Database

    def refund_request(self, tool: str) -> StoredRequest:
        """The one approval of the `demo_refunds` run that called `tool`."""
        requests = list_requests(self.db, status=None, agent="demo_refunds")
        [request] = [r for r in requests if r.tool == tool]
        return request


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, broker: Broker) -> Iterator[Demo]:
    cwd = tmp_path_factory.mktemp("demo")
    done = forkserver.run(
        [sys.executable, "-m", "cli.main", "demo"],
        cwd=cwd,
        env=_demo_env(broker),
        capture_output=True,
        text=True,
        timeout=280,
    )

    home = cwd / ".relayq" / "demo"
    db = Database(f"sqlite:///{home / 'relayq.db'}")
    yield Demo(home, done.stdout, done.stderr, done.returncode, db)
    db.dispose()


def _demo_env(broker: Broker) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAYQ_")}
    env["PYTHONPATH"] = str(ROOT)
    if not broker.url.startswith("redis+socket"):  # the machine's Redis, on the tests' db
        env["RELAYQ_BROKER_URL"] = broker.url
        env["RELAYQ_KEY_PREFIX"] = broker.new_prefix()
    return env


def test_the_demo_runs_twenty_jobs_answers_their_approvals_by_api_and_stops_everything(
    demo: Demo,
):
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    results = [json.loads(line) for line in (demo.home / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in results] == [f"job-{n:02d}" for n in range(1, 21)]
    assert {r["status"] for r in results} == {"done"}
    # The back-office policy: up to 150 approved, above declined, job by job.
    for n, r in enumerate(results):
        amount = order_record(str(1001 + n))["amount"]
        expected = "refund made" if amount <= 150 else "refund not made"
        assert r["text"].startswith(f"Order {1001 + n}: {expected}"), r
    answered = list_requests(demo.db, status=None, agent="demo", limit=100)
    assert len(answered) == 20
    assert {r.status for r in answered} == {"answered"}
    assert {r.answered_by for r in answered} == {"backoffice"}
    assert "20 jobs: 20 done" in demo.stdout
    assert "approvals waiting" in demo.stdout
    assert _processes_with(f"RELAYQ_HOME={demo.home}") == [], "every process the demo started"


def test_finance_edits_a_refund_and_the_tool_runs_with_the_edited_amount(demo: Demo):
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    request = demo.refund_request("refund")
    proposed = request.request.data["arguments"]
    assert proposed["amount"] == order_record(proposed["order"])["amount"] <= QUORUM_ABOVE
    half = round(proposed["amount"] / 2, 2)

    [decision] = decisions_of(demo.db, request.request.id)
    assert (decision.actor, decision.groups, decision.via) == ("ann", ["finance"], "api")
    assert decision.outcome == request.outcome == "edited"
    assert decision.diff == {"amount": [proposed["amount"], half]}
    run = run_result(demo.db, request.run_id)
    [refund] = [c for c in run.tool_calls if c.name == "refund"]
    ran = f"refunded {half:.2f} on order {proposed['order']}"
    assert refund.output.endswith(ran), "the tool ran with the edited amount, not the model's"
    assert run.status == "done"
    assert f"the refund tool ran on the worker: '{ran}'" in demo.stdout


def test_a_large_refund_runs_once_two_of_finance_approved_it(demo: Demo):
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    request = demo.refund_request("refund_large")
    proposed = request.request.data["arguments"]
    assert proposed["amount"] > QUORUM_ABOVE
    assert (request.quorum, request.approvers, request.outcome) == (2, ["finance"], "approved")

    trail = decisions_of(demo.db, request.request.id)
    assert [(d.actor, d.outcome, d.groups, d.via) for d in trail] == [
        ("ann", "approved", ["finance"], "api"),
        ("ben", "approved", ["finance"], "api"),
    ]
    assert "ann (finance) approves: 1 of 2 approvals, the request is still open" in demo.stdout
    assert "ben (finance) approves: 2 of 2 approvals, the request is answered" in demo.stdout
    run = run_result(demo.db, request.run_id)
    [refund] = [c for c in run.tool_calls if c.name == "refund_large"]
    assert refund.output == f"refunded {proposed['amount']:.2f} on order {proposed['order']}"


def test_the_worker_sent_the_approval_runs_events_as_signed_webhooks(demo: Demo):
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    got = [json.loads(line) for line in (demo.home / "webhooks.jsonl").read_text().splitlines()]
    runs = {r.run_id for r in list_requests(demo.db, status=None, agent="demo_refunds")}
    ours = [e for e in got if e["data"]["runId"] in runs]
    # The receiver keeps an event only once its signature verified.
    assert {(e["data"]["runId"], e["type"]) for e in ours} == {
        (run, kind)
        for run in runs
        for kind in ("request.opened", "request.decided", "run.finished")
    }
    assert len({e["id"] for e in got}) == len(got), "each event kept once"
    # The store's delivery log agrees: each delivery it records was received. (The last
    # few may be unrecorded when the worker stopped: how many depends on the machine.)
    delivered = list_deliveries(demo.db, state="delivered", endpoint="demo", limit=1000)
    assert delivered
    assert {d.event_id for d in delivered} <= {e["id"] for e in got}
    assert list_deliveries(demo.db, state="failed") == []
    said = " ".join(demo.stdout.split())  # the console wraps its lines at its width
    assert "every signature verified with tasks.webhooks.sender.verify_signature" in said
    assert "refused for a bad signature" not in demo.stdout


def test_the_demo_shows_no_token(demo: Demo):
    token = (demo.home / "token").read_text().strip()
    shown = [demo.stdout, demo.stderr, *(p.read_text() for p in demo.home.glob("*.log"))]
    assert token
    assert not any(token in text for text in shown)


def test_keep_leaves_the_inbox_up_with_an_approvers_token_until_ctrl_c_stops_everything(
    tmp_path: Path, broker: Broker
):
    # Given `relayq demo --keep`, run as from a terminal (its own process group)
    cwd = tmp_path / "keep"
    cwd.mkdir()
    home = cwd / ".relayq" / "demo"
    out = cwd / "stdout.txt"
    with out.open("wb") as stdout, (cwd / "stderr.txt").open("wb") as stderr:
        demo = forkserver.spawn(
            [sys.executable, "-m", "cli.main", "demo", "--keep"],
            cwd=cwd, env=_demo_env(broker), stdout=stdout, stderr=stderr,
            start_new_session=True,
        )  # fmt: skip
    try:
        # When it has run, it prints the inbox's address and an approver's token, and waits
        deadline = time.monotonic() + 240
        while "Ctrl-C stops them all." not in out.read_text():
            assert demo.poll() is None, out.read_text()[-3000:] + (cwd / "stderr.txt").read_text()
            assert time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.2)
        printed = out.read_text()
        inbox = re.search(r"^inbox: +(http://127\.0\.0\.1:\d+)/$", printed, re.MULTILINE)
        assert inbox, printed[-3000:]
        said = r"log in as ann \(approver, finance\) with the token (\S+)$"
        token = re.search(said, printed, re.MULTILINE)
        assert token, printed[-3000:]
        assert "Flower: http://127.0.0.1:" in printed

        # Then the inbox asks for a token, takes that one, and lists the refunds left waiting
        with httpx.Client(base_url=inbox.group(1), trust_env=False, timeout=30) as http:
            login = http.get("/")
            assert 'name="token"' in login.text, login.text
            assert "demo_refunds" not in login.text
            csrf = re.search(r'name="csrf_token" value="([^"]+)"', login.text)
            assert csrf, login.text
            form = {"token": token.group(1), "csrf_token": csrf.group(1), "next": "/"}
            assert http.post("/login", data=form).status_code == 303
            listing = http.get("/")
            assert listing.status_code == 200
            assert listing.text.count("demo_refunds") >= 2
        assert len(_processes_with(f"RELAYQ_HOME={home}")) == 3  # the worker, the API, Flower

        # When Ctrl-C reaches its group, as from a terminal
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(timeout=60)
    finally:
        stop_group(demo)
    # Then every process it started has stopped
    assert demo.returncode == 0, (cwd / "stderr.txt").read_text()
    assert _processes_with(f"RELAYQ_HOME={home}") == []
    assert not (home / "redis.sock").exists(), "the embedded broker, if it ran, stopped too"


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
