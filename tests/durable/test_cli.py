"""The `relayq` command line against real workers: in-process with CliRunner, and as a process."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from cli.main import app
from relayq import RunResult, new_id
from store import (
    Database,
    RequestQuery,
    RunQuery,
    RunSpec,
    get_request,
    get_run,
    list_requests,
    list_runs,
    migrate,
    query_requests,
    run_result,
    start_batch,
)
from store.models import DecisionRow, utcnow
from store.requests import StoredRequest
from tests import forkserver
from tests.processes import stop_group
from tests.store.driver import halt_on_relay
from tests.store.test_request_queries import listing_rows, seeded_requests
from tests.waiting import until

from .conftest import ROOT, Broker, Durable, unique_name
from .desk import crowd, new_tag, start_refunds

RELAYQ = Path(sys.executable).parent / "relayq"
COMMANDS = [
    "worker", "beat", "api", "flower", "demo", "run", "batch",
    "runs", "show", "cancel", "pending", "answer", "bulk", "audit",
]  # fmt: skip


@pytest.fixture
def cli(durable: Durable) -> Callable[..., Result]:
    """Invoke `relayq ARGS` in this process, with the environment the workers have."""
    runner = CliRunner()
    env = {**durable.env, "COLUMNS": "250"}

    def invoke(*args: str, input: str | None = None) -> Result:
        return runner.invoke(app, list(args), env=env, catch_exceptions=False, input=input)

    return invoke


def one_error_line(result: Result) -> str:
    """The single `relayq: error:` line a refused command prints, and nothing else on stderr."""
    assert result.exit_code != 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("relayq: error: "), lines[0]
    return lines[0]


def run_id_in(output: str) -> str:
    found = re.search(r"^run (run_[0-9a-f]+)", output, re.MULTILINE)
    assert found, output
    return found.group(1)


def request_id_in(output: str) -> str:
    found = re.search(r"^pending (req_[0-9a-f]+)", output, re.MULTILINE)
    assert found, output
    return found.group(1)


def settle(durable: Durable, run_id: str, status: str, timeout: float = 30.0) -> RunResult:
    """Poll the store until the run reaches `status`."""
    db = durable.db()

    def there() -> RunResult | None:
        res = run_result(db, run_id)
        return res if res.status == status else None

    try:
        return until(there, what=f"run {run_id} to be {status}", timeout=timeout)
    finally:
        db.dispose()


_module_began: datetime | None = None


@pytest.fixture(scope="module", autouse=True)
def module_began() -> datetime:
    """When the module's tests began on this lane: its snapshots hold the runs made since
    (`store_snapshot`), not an earlier module's, which may still be moving on the lane's
    store (a module that imports this fixture gets the same)."""
    global _module_began
    _module_began = utcnow()
    return _module_began


def store_snapshot(durable: Durable) -> tuple[list[Any], list[StoredRequest]]:
    """Every run the module made, its id, status and version, and their requests: what a
    refused command must not change.

    Taken once none of them is queued or running (within 30 s, else the test fails): an
    earlier test's runs that the lane's worker is still taking would change it."""
    db = durable.db()
    since = _module_began or datetime.min.replace(tzinfo=UTC)

    moving: list[Any] = []

    def still() -> tuple[list[Any]] | None:
        listed = [r for r in list_runs(db, RunQuery(limit=1_000_000)) if r.created_at >= since]
        moving[:] = [r for r in listed if r.status in ("queued", "running")]
        # In a tuple: a store with no run at all is still too (`until` waits for a truthy)
        return None if moving else (listed,)

    def which() -> str:
        """The runs still moving, for the test that left them to be found."""
        return "\n".join(
            f"{r.id} of {r.agent!r} {r.status} at version {r.version}, since {r.updated_at}"
            for r in moving
        )

    try:
        (listed,) = until(still, what="every run to stop moving", said=which)
        runs = [(r.id, r.status, r.version) for r in listed]
        ids = {r.id for r in listed}
        requests = list_requests(db, status=None, limit=1_000_000)
        return runs, [r for r in requests if r.run_id in ids]
    finally:
        db.dispose()


def run_count(durable: Durable) -> int:
    return len(store_snapshot(durable)[0])


def stored_request(durable: Durable, request_id: str) -> StoredRequest:
    db = durable.db()
    try:
        return get_request(db, request_id)
    finally:
        db.dispose()


def halt_on_lookup(cli: Callable[..., Result], prompt: str) -> tuple[str, str]:
    """Run the `lookup` agent until it waits on its relay call; returns (run id, request id)."""
    result = cli("run", "lookup", prompt, "--timeout", "30")
    assert result.exit_code == 0, result.output
    assert "→ lookup" in result.stdout
    return run_id_in(result.stdout), request_id_in(result.stdout)


# --- help and processes -------------------------------------------------------------


PASSED_TO_CELERY = ("worker", "beat")
"""Commands whose arguments go to Celery's own command line, help and all."""


def test_every_command_has_help_as_a_real_process():
    # The console script itself, as installed: it imports every command's module
    top = forkserver.run([str(RELAYQ), "--help"], capture_output=True, text=True, timeout=30)
    assert top.returncode == 0, top.stderr
    for command in COMMANDS:
        assert command in top.stdout

    # Each command's own help: Celery's for those it passes on, as processes; the others'
    # from the same app in this process (a process each adds its start-up, not a check)
    for command in COMMANDS:
        if command in PASSED_TO_CELERY:
            done = forkserver.run(
                [sys.executable, "-m", "cli.main", command, "--help"],
                cwd=ROOT, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert done.returncode == 0, (command, done.stderr)
            out = done.stdout
        else:
            result = CliRunner().invoke(app, [command, "--help"], catch_exceptions=False)
            assert result.exit_code == 0, (command, result.output)
            out = result.stdout
        assert f"relayq {command}" in out, out
        if command == "worker":
            assert "RELAYQ_AGENTS" in out


def test_run_as_a_real_process_streams_tool_calls_and_results_then_the_text(
    durable: Durable, prompt: str
):
    done = forkserver.run(
        [str(RELAYQ), "run", "two-step", prompt, "--timeout", "30"],
        cwd=ROOT,
        env={**durable.env, "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("run run_")
    assert f"user  {prompt}" in lines
    assert any(line.strip().startswith("→ step {}") for line in lines), done.stdout
    assert "  ← step: stepped" in lines
    assert lines[-2:] == ["done", "stepped"]


@pytest.fixture
def cli_worker(durable: Durable, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A worker started by `relayq worker`, on a key prefix of its own; yields its environment."""
    env = {
        **durable.env,
        "RELAYQ_KEY_PREFIX": durable.broker.new_prefix(),
        "RELAYQ_AGENTS": "",  # the --agents option has to set it
    }
    log = tmp_path / "cli-worker.log"
    name = f"cli-{uuid.uuid4().hex[:6]}@%h"
    with log.open("ab") as out:
        proc = forkserver.spawn(
            [str(RELAYQ), "worker", "--agents", "tests.durable.agents", "-c", "2", "-l", "info",
             "--", "--without-mingle", "--without-gossip", "-n", name],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        while b" ready." not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"relayq worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        yield {**env, "RELAYQ_AGENTS": "tests.durable.agents"}
    finally:
        stop_group(proc)


def test_relayq_worker_starts_a_worker_that_runs_turns(cli_worker: dict[str, str], prompt: str):
    result = CliRunner().invoke(
        app, ["run", "recall", prompt, "--timeout", "30"], env=cli_worker, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-2:] == ["done", prompt]


def test_a_bad_agents_module_stops_the_worker_with_one_line(durable: Durable):
    done = forkserver.run(
        [str(RELAYQ), "worker", "--agents", "no_such_module_here"],
        cwd=ROOT,
        env=durable.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "relayq: error: RELAYQ_AGENTS: cannot import agent module 'no_such_module_here': "
        "No module named 'no_such_module_here'"
    ]


# --- run, show, answer, pending, runs, cancel ----------------------------------------


def test_run_prints_the_final_text_of_a_done_run(cli: Callable[..., Result], prompt: str):
    result = cli("run", "recall", prompt, "--timeout", "30")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-2:] == ["done", prompt]
    assert result.stderr == ""


def test_run_gives_up_after_its_timeout_with_a_non_zero_exit(
    cli: Callable[..., Result], durable: Durable, prompt: str
):
    result = cli("run", "holding", prompt, "--timeout", "0.5")
    run_id = run_id_in(result.stdout)
    try:
        line = one_error_line(result)
        assert re.search(rf"run {run_id} is still (queued|running) after 0.5 s", line), line
    finally:
        (durable.log / f"release-{run_id}").touch()  # let the held turn end
    settle(durable, run_id, "done")
    assert durable.count("tool", f"hold {run_id} released") == 1, "the tool was let go"


def test_a_failed_run_and_a_batch_of_one_job_say_so_in_the_singular(
    cli: Callable[..., Result], prompt: str, tmp_path: Path
):
    # When a run fails (its model refuses the request for good)
    failed = one_error_line(cli("run", "refusing", prompt, "--timeout", "30"))
    # Then the error says the run failed
    assert re.fullmatch(r"relayq: error: run run_[0-9a-f]+ failed: .*no such model.*", failed)

    # When a batch of one job fails the same way
    jobs = write_jobs(tmp_path / unique_name("jobs.jsonl"), [{"id": 1, "prompt": f"{prompt} 1"}])
    output = tmp_path / "out.jsonl"
    done = cli("batch", "refusing", str(jobs), "-o", str(output), "--timeout", "30")

    # Then its verdict counts one job and one run
    assert done.exit_code == 1, done.output
    assert done.stdout.splitlines() == [f"1 job: 1 failed; results in {output}"]
    assert done.stderr.strip().splitlines()[-1] == (
        f"relayq: error: 1 of 1 run did not end done; see {output}"
    )


def test_a_pending_run_is_listed_answered_with_output_and_shown(
    cli: Callable[..., Result], durable: Durable, prompt: str
):
    # Given a run halted on its relay call
    run_id, request_id = halt_on_lookup(cli, prompt)
    assert f"relayq answer {request_id} --output TEXT" in cli("show", run_id).stdout

    # Then `pending` and `runs --status pending` list it
    pending = cli("pending", "--agent", "lookup", "--run", run_id)
    assert pending.exit_code == 0
    row = next(line for line in pending.stdout.splitlines() if request_id in line)
    assert run_id in row
    assert "lookup" in row
    listed = cli("runs", "--status", "pending", "--agent", "lookup", "--limit", "1000")
    assert run_id in listed.stdout
    assert run_id not in cli("runs", "--status", "done", "--limit", "1000").stdout

    # When it is answered
    answered = cli("answer", request_id, "--output", "found it", "--as", "alice")
    assert answered.exit_code == 0, answered.output
    assert f"answered {request_id} as alice" in answered.stdout

    # Then the run ends with the answer, and `show` tells the whole story
    assert settle(durable, run_id, "done").text == "found it"
    assert request_id not in cli("pending", "--all").stdout
    shown = cli("show", run_id)
    assert shown.exit_code == 0, shown.output
    assert f"run {run_id}  agent lookup  done" in shown.stdout
    assert "── turn 1" in shown.stdout
    assert "── turn 2" in shown.stdout
    assert "  ← lookup: found it" in shown.stdout
    assert f"request {request_id} answered by alice" in shown.stdout
    assert shown.stdout.splitlines()[-2:] == ["done", "found it"]


def test_an_approval_is_edited_and_approved_from_the_cli_and_the_trail_says_who(
    cli: Callable[..., Result], durable: Durable, prompt: str
):
    # Given a refund waiting on two approvers of finance
    result = cli("run", "refunds", prompt, "--timeout", "30")
    assert result.exit_code == 0, result.output
    run_id, request_id = run_id_in(result.stdout), request_id_in(result.stdout)
    before = store_snapshot(durable)

    # When someone outside finance tries, ben edits the amount, and carol approves it
    outsider = cli("answer", request_id, "--approve", "--as", "sam", "--group", "support")
    assert "not in the approver groups" in one_error_line(outsider)
    assert store_snapshot(durable) == before
    edited = cli(
        "answer", request_id, "--edit", "amount=50", "--as", "ben", "--group", "finance"
    )  # fmt: skip
    assert edited.exit_code == 0, edited.output
    assert "stays open" in edited.stdout
    assert "via the CLI" in edited.stdout
    approved = cli("answer", request_id, "--approve", "--as", "carol", "--group", "finance")
    assert approved.exit_code == 0, approved.output

    # Then the refund ran once with 50, and the audit trail says who, how and what changed
    done = settle(durable, run_id, "done")
    assert "refunded 50 on order 17" in done.text
    assert durable.count("tool", f"refund {run_id} 50") == 1
    trail = cli("audit", "--agent", "refunds", "--actor", "ben", "--json")
    assert trail.exit_code == 0, trail.output
    [ben] = [i for i in json.loads(trail.stdout)["items"] if i["requestId"] == request_id]
    assert (ben["via"], ben["outcome"], ben["diff"]) == ("cli", "edited", {"amount": [500, 50]})
    assert ben["osUser"]
    table = cli("audit", "--agent", "refunds")
    assert "carol" in table.stdout
    assert "approved" in table.stdout


def test_bulk_previews_asks_and_decides_every_match_or_nothing(
    cli: Callable[..., Result], durable: Durable
):
    # Given three refunds waiting on finance
    tag = new_tag()
    runs = asyncio.run(start_refunds(durable, tag, 3))
    db = durable.db()
    deadline = time.monotonic() + 60
    while query_requests(db, RequestQuery(search=tag)).total < 3:
        assert time.monotonic() < deadline, "the refunds did not open"
        time.sleep(0.1)
    db.dispose()
    before = store_snapshot(durable)
    args = ("bulk", "--approve", "--search", tag)

    # When someone outside finance confirms, everything is refused, each request named
    outsider = cli(*args, "--as", "sam", "--member-of", "support", input="y\n")
    assert outsider.exit_code == 1, outsider.output
    assert "Nothing was decided: 3 of 3 refused it" in outsider.stdout
    assert outsider.stdout.count("not in the approver groups") == 3
    # ... and when dan of finance sees the preview and says no, nothing is decided either
    declined = cli(*args, "--as", "dan", "--member-of", "finance", input="n\n")
    assert declined.exit_code == 1, declined.output
    assert "3 open requests match; to approve:" in declined.stdout
    assert "Approve these 3 requests?" in declined.stdout
    assert "Nothing was decided." in declined.stdout
    assert store_snapshot(durable) == before

    # When he says yes
    approved = cli(*args, "--as", "dan", "--member-of", "finance", input="y\n")

    # Then all three are approved as dan, through the CLI, and their runs refund
    assert approved.exit_code == 0, approved.output
    assert "3 requests approved as dan (via cli, OS user" in approved.stdout
    for run_id in runs:
        assert settle(durable, run_id, "done").text.startswith("refunded")
    trail = json.loads(cli("audit", "--actor", "dan", "--json").stdout)["items"]
    assert {(d["via"], d["outcome"]) for d in trail if d["runId"] in runs} == {("cli", "approved")}


def test_bulk_approve_takes_the_oldest_1000_and_says_it_left_relay_requests_out(
    cli: Callable[..., Result], durable: Durable
):
    # Given 1,001 refund approvals waiting, after 3 older relay requests
    tag = new_tag()
    with crowd(durable, tag, 1001, relay=3):
        before = store_snapshot(durable)

        # When dan asks to approve all that match, and says no at the question
        asked = cli("bulk", "--approve", "--search", tag, "--as", "dan", input="n\n")

        # Then one line says what was left out and why, the preview names the cap,
        # the question the oldest 1,000, and nothing is decided
        assert asked.exit_code == 1, asked.output
        left_out = "left out 3 relay requests: they take an answer, not a decision"
        assert asked.stdout.count(left_out) == 1, asked.stdout
        assert "(relayq answer REQ --output ...)" in asked.stdout
        assert "1,001 open requests match; a bulk decision takes at most 1,000: " in asked.stdout
        assert "Approve the oldest 1,000 of these 1,001 requests?" in asked.stdout
        assert "Nothing was decided." in asked.stdout

        # When only relay requests match, it says so too
        relay_only = cli("bulk", "--approve", "--search", tag, "--tool", "lookup", "-y")
        assert relay_only.exit_code == 0, relay_only.output
        assert left_out in relay_only.stdout
        assert "No open request matches; nothing to decide." in relay_only.stdout
        assert store_snapshot(durable) == before


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--approve"], "give at least one filter"),
        (["--approve", "--decline", "no", "--agent", "desk"], "one of --approve or --decline"),
        (["--decline", " ", "--agent", "desk"], "--decline takes a reason"),
        (["--agent", "desk"], "one of --approve or --decline"),
    ],
)
def test_bulk_refuses_an_unclear_command_with_one_line(
    cli: Callable[..., Result], args: list[str], says: str
):
    assert says in one_error_line(cli("bulk", *args))


def test_a_declined_answer_continues_the_run(
    cli: Callable[..., Result], durable: Durable, prompt: str
):
    result = cli("run", "seed-decline", prompt, "--timeout", "30")
    assert result.exit_code == 0, result.output
    assert "  ← real_tool: real-output" in result.stdout
    run_id, request_id = run_id_in(result.stdout), request_id_in(result.stdout)

    declined = cli("answer", request_id, "--decline", "not today")
    assert declined.exit_code == 0, declined.output
    assert declined.stdout.startswith(f"declined {request_id}")

    assert settle(durable, run_id, "done").text == "handled the decline"
    shown = cli("show", run_id).stdout
    assert "  ✗ relayed_tool: declined: not today" in shown
    assert f"request {request_id} answered by " in shown
    assert "(declined)" in shown


def test_a_results_file_answers_each_call_by_id(
    cli: Callable[..., Result], durable: Durable, prompt: str, tmp_path: Path
):
    result = cli("run", "seed-three", prompt, "--timeout", "30")
    run_id, request_id = run_id_in(result.stdout), request_id_in(result.stdout)
    assert f"relayq answer {request_id} --results results.json" in result.stdout
    answers = tmp_path / "results.json"
    answers.write_text(json.dumps([{"id": c, "output": c.upper()} for c in ("c3", "c1", "c2")]))
    assert cli("answer", request_id, "--results", str(answers)).exit_code == 0
    assert settle(durable, run_id, "done").text == "C1,C2,C3"


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("not json", "is not valid JSON"),
        ('[{"output": "no id"}]', "item 0.id: Field required"),
        ("[]", "must hold a non-empty list"),
    ],
)
def test_a_bad_results_file_is_refused_and_changes_nothing(
    cli: Callable[..., Result],
    durable: Durable,
    prompt: str,
    tmp_path: Path,
    content: str,
    complaint: str,
):
    _, request_id = halt_on_lookup(cli, prompt)
    before = store_snapshot(durable)
    bad = tmp_path / "bad.json"
    bad.write_text(content)

    assert complaint in one_error_line(cli("answer", request_id, "--results", str(bad)))
    assert store_snapshot(durable) == before


def test_answering_twice_is_refused_and_the_first_answer_stands(
    cli: Callable[..., Result], durable: Durable, prompt: str
):
    run_id, request_id = halt_on_lookup(cli, prompt)
    assert cli("answer", request_id, "--output", "first", "--as", "alice").exit_code == 0
    settle(durable, run_id, "done")
    before = store_snapshot(durable)

    line = one_error_line(cli("answer", request_id, "--output", "second", "--as", "bob"))
    assert line == f"relayq: error: request {request_id} is already answered"
    assert store_snapshot(durable) == before
    stored = stored_request(durable, request_id)
    assert stored.answered_by == "alice"
    assert stored.answer is not None
    assert stored.answer.data == {"output": "first", "isError": False}


def test_an_unknown_request_id_is_refused_and_changes_nothing(
    cli: Callable[..., Result], durable: Durable
):
    before = store_snapshot(durable)
    line = one_error_line(cli("answer", "req_nosuchrequest", "--output", "x"))
    assert line == (
        "relayq: error: unknown request id 'req_nosuchrequest' "
        "(never made, or removed with its run)"
    )
    assert store_snapshot(durable) == before


def test_answer_takes_exactly_one_kind_of_answer(cli: Callable[..., Result], durable: Durable):
    before = store_snapshot(durable)
    both = cli("answer", "req_x", "--output", "a", "--decline", "b")
    assert "exactly one of --output, --results, --approve, --edit, --decline" in one_error_line(
        both
    )
    assert "(got 0)" in one_error_line(cli("answer", "req_x"))
    assert store_snapshot(durable) == before


def test_an_unknown_agent_is_refused_and_starts_nothing(
    cli: Callable[..., Result], durable: Durable, tmp_path: Path
):
    before = store_snapshot(durable)
    line = one_error_line(cli("run", "no-such-agent", "hello"))
    assert line.startswith("relayq: error: unknown agent 'no-such-agent'")
    assert "lookup" in line  # it names the agents it knows

    jobs = tmp_path / unique_name("jobs.jsonl")
    jobs.write_text('{"id": 1, "prompt": "hello"}\n')
    batch = cli("batch", "no-such-agent", str(jobs), "-o", str(tmp_path / "out.jsonl"))
    assert one_error_line(batch).startswith("relayq: error: unknown agent 'no-such-agent'")
    assert store_snapshot(durable) == before
    assert not (tmp_path / "out.jsonl").exists()


def test_unknown_run_ids_are_refused(cli: Callable[..., Result]):
    assert one_error_line(cli("show", "run_nosuchrun")) == (
        "relayq: error: unknown run id 'run_nosuchrun' (never made, or removed once finished)"
    )
    assert one_error_line(cli("cancel", "run_nosuchrun")) == (
        "relayq: error: unknown run id 'run_nosuchrun' (never made, or removed once finished)"
    )


def test_cancel_stops_a_pending_run_and_a_second_cancel_is_refused(
    cli: Callable[..., Result], durable: Durable, prompt: str
):
    run_id, request_id = halt_on_lookup(cli, prompt)

    cancelled = cli("cancel", run_id)
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.strip() == f"cancelled {run_id}"
    assert settle(durable, run_id, "cancelled").status == "cancelled"
    assert stored_request(durable, request_id).status == "cancelled"
    assert run_id in cli("runs", "--status", "cancelled", "--limit", "1000").stdout

    line = one_error_line(cli("cancel", run_id))
    assert line == f"relayq: error: run {run_id} is already cancelled; there is nothing to cancel"
    answer = one_error_line(cli("answer", request_id, "--output", "late"))
    assert answer == f"relayq: error: request {request_id} is already cancelled"


def test_runs_refuses_an_unknown_status(cli: Callable[..., Result]):
    assert "unknown status 'weird'" in one_error_line(cli("runs", "--status", "weird"))


# --- pending: pages, totals, filters ---------------------------------------------------


@pytest.fixture
def listing(durable: Durable) -> Iterator[tuple[str, str]]:
    """60 open and 5 answered requests of an agent of this test only (`listing_rows`):
    (agent, tag), removed after."""
    tag = uuid.uuid4().hex[:8]
    agent = f"listing-{tag}"
    db = durable.db()
    try:
        with seeded_requests(db, listing_rows(tag, agent)):
            yield agent, tag
    finally:
        db.dispose()


def listed_numbers(output: str, tag: str) -> list[int]:
    return [int(n) for n in re.findall(rf"req_{tag}_(\d{{3}})", output)]


def test_pending_says_how_many_match_in_all_and_prints_the_command_for_the_next_page(
    cli: Callable[..., Result], listing: tuple[str, str]
):
    agent, tag = listing

    # When the first page is listed
    first = cli("pending", "--agent", agent)

    # Then it shows the 50 oldest, says 60 in all, and how to go on
    assert first.exit_code == 0, first.output
    assert listed_numbers(first.stdout, tag) == list(range(50))
    assert "showing 50 of 60 open requests, oldest first" in first.stdout
    hint = first.stdout.strip().splitlines()[-1]
    assert hint.startswith(f"next page: relayq pending --agent {agent} --cursor ")

    # And that command shows the other 10, and says it is the end
    rest = cli(*shlex.split(hint.removeprefix("next page: relayq ")))
    assert rest.exit_code == 0, rest.output
    assert listed_numbers(rest.stdout, tag) == list(range(50, 60))
    assert "showing 10 of 60 open requests, oldest first" in rest.stdout
    assert "next page" not in rest.stdout


def test_pending_all_walks_every_page(cli: Callable[..., Result], listing: tuple[str, str]):
    agent, tag = listing

    every = cli("pending", "--agent", agent, "--all", "--limit", "7")
    with_closed = cli("pending", "--agent", agent, "--all", "--status", "all")

    assert listed_numbers(every.stdout, tag) == list(range(60))
    assert "showing all 60 open requests, oldest first" in every.stdout
    assert "next page" not in every.stdout
    assert listed_numbers(with_closed.stdout, tag) == list(range(65))
    assert "showing all 65 requests" in with_closed.stdout
    assert re.search(rf"req_{tag}_064 .* answered ", with_closed.stdout)


def test_pending_json_prints_the_page_as_the_api_gives_it(
    cli: Callable[..., Result], listing: tuple[str, str]
):
    agent, tag = listing

    page = json.loads(cli("pending", "--agent", agent, "--limit", "5", "--json").stdout)
    after = cli(
        "pending", "--agent", agent, "--limit", "5", "--json", "--cursor", page["nextCursor"]
    )

    assert set(page) == {"items", "total", "nextCursor"}
    assert page["total"] == 60
    assert [r["request"]["id"] for r in page["items"]] == [f"req_{tag}_{n:03d}" for n in range(5)]
    assert page["items"][0]["runId"] == f"run_{tag}_0"
    assert json.loads(after.stdout)["items"][0]["request"]["id"] == f"req_{tag}_005"


PENDING_FILTERS = [
    pytest.param(["--tool", "lookup", "--limit", "3"], [1, 4, 7], id="tool"),
    pytest.param(["--group", "finance", "--limit", "3"], [0, 5, 10], id="group"),
    pytest.param(["--kind", "approval", "--limit", "2"], [0, 4], id="kind"),
    pytest.param(["-q", "100%"], [7], id="search, percent taken literally"),
    pytest.param(["--search", "rate is"], [7, 8], id="search"),
    pytest.param(["--status", "answered", "--order", "desc"], [64, 63, 62, 61, 60], id="status"),
    pytest.param(["--sort", "tool", "--limit", "2"], [2, 5], id="sort by tool"),
    pytest.param(["--older-than", "1d", "--limit", "2"], [0, 1], id="older than"),
    pytest.param(["--newer-than", "1d"], [], id="newer than"),
]


@pytest.mark.parametrize(("options", "expected"), PENDING_FILTERS)
def test_pending_filters_searches_and_sorts(
    cli: Callable[..., Result], listing: tuple[str, str], options: list[str], expected: list[int]
):
    agent, tag = listing

    result = cli("pending", "--agent", agent, *options)

    assert result.exit_code == 0, result.output
    assert listed_numbers(result.stdout, tag) == expected


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--cursor", "not-a-cursor"], "bad cursor"),
        (["--status", "sleeping"], "unknown --status 'sleeping'"),
        (["--sort", "size"], "unknown --sort 'size'"),
        (["--order", "up"], "unknown --order 'up'"),
        (["--older-than", "soon"], "cannot read 'soon' as an age"),
    ],
)
def test_pending_refuses_a_bad_option_with_one_line(
    cli: Callable[..., Result], options: list[str], says: str
):
    assert says in one_error_line(cli("pending", *options))


# --- on a store of its own, with no worker: what takes no turn --------------------------


@pytest.fixture
def alone(tmp_path: Path, broker: Broker) -> Callable[..., Result]:
    """Invoke `relayq ARGS` in this process on a store (SQLite, in `tmp_path`) and a key
    prefix of this test only, with no worker; `env` goes over that environment."""
    runner = CliRunner()
    base = {
        "RELAYQ_HOME": str(tmp_path),
        "RELAYQ_DATABASE_URL": f"sqlite:///{tmp_path / 'relayq.db'}",
        "RELAYQ_BROKER_URL": broker.url,
        "RELAYQ_KEY_PREFIX": broker.new_prefix(),
        "RELAYQ_AGENTS": "tests.durable.agents",
        "COLUMNS": "250",
    }

    def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        merged = {**base, **(env or {})}
        return runner.invoke(app, list(args), env=merged, catch_exceptions=False, input=input)

    return invoke


def own_store(tmp_path: Path) -> Database:
    """The store `alone` uses, migrated."""
    db = Database(f"sqlite:///{tmp_path / 'relayq.db'}")
    migrate(db)
    return db


def halted_run(tmp_path: Path) -> tuple[str, str]:
    """A run of the agent `agent` in `alone`'s store, halted on a relay call, as a worker
    leaves it: (run id, request id)."""
    run_id = new_id("run")
    db = own_store(tmp_path)
    try:
        _, _, turn = asyncio.run(halt_on_relay(db, "c1", run_id=run_id))
    finally:
        db.dispose()
    assert turn.pending is not None
    return run_id, turn.pending.id


def test_an_audit_cursor_carries_the_filters_of_its_page(
    alone: Callable[..., Result], tmp_path: Path
):
    # Given a trail of declined and answered requests, interleaved
    db = own_store(tmp_path)
    try:
        with db.write() as s:
            for n in range(7):
                outcome = "declined" if n % 2 == 0 else "answered"
                s.add(
                    DecisionRow(
                        request_id=f"req_{n}", run_id=f"run_{n}", agent="refunds", actor="ann",
                        via="cli", outcome=outcome, at=utcnow(),
                    )
                )  # fmt: skip
    finally:
        db.dispose()

    # When the declined ones are listed a page of 3, and the printed command run as it is
    first = alone("audit", "--outcome", "declined", "--limit", "3", "--json")
    page = json.loads(first.stdout)
    assert [i["requestId"] for i in page["items"]] == ["req_6", "req_4", "req_2"]
    second = json.loads(alone("audit", "--cursor", page["nextCursor"], "--json").stdout)

    # Then the next page is the rest of the declined ones, no answered one among them
    assert [i["requestId"] for i in second["items"]] == ["req_0"]
    assert second["nextCursor"] is None
    table = alone("audit", "--outcome", "declined", "--limit", "3")
    assert f"more: relayq audit --cursor {page['nextCursor']}" in table.stdout
    # ... and a cursor that is none is one line
    assert "bad cursor" in one_error_line(alone("audit", "--cursor", "42"))


def test_show_of_a_request_names_its_run_and_agent_then_shows_the_run(
    alone: Callable[..., Result], tmp_path: Path
):
    # Given a run halted on a relay call
    run_id, request_id = halted_run(tmp_path)

    # When the run is shown, and then its request
    by_run = alone("show", run_id)
    by_request = alone("show", request_id)

    # Then the run shows its agent, its status and the request it waits on
    assert by_run.exit_code == 0, by_run.output
    run_lines = by_run.stdout.splitlines()
    assert run_lines[0].startswith(f"run {run_id}  agent agent  pending  turns 1")
    assert f"pending {request_id}  (tool_call)" in by_run.stdout
    # ... and the request names its run and the run's agent, then shows that run
    assert by_request.exit_code == 0, by_request.output
    request_lines = by_request.stdout.splitlines()
    assert request_lines[0] == (
        f"request {request_id} (tool_call, open) of run {run_id}, agent agent"
    )
    assert request_lines[1].startswith(f"run {run_id}  agent agent  pending  turns 1")
    assert request_lines[2:] == run_lines[1:]
    # ... and an unknown request is one line
    assert one_error_line(alone("show", "req_nosuchrequest")) == (
        "relayq: error: unknown request id 'req_nosuchrequest' "
        "(never made, or removed with its run)"
    )


def test_a_count_of_one_reads_in_the_singular(alone: Callable[..., Result], tmp_path: Path):
    # Given one run waiting on one request, and a batch of one job
    halted_run(tmp_path)
    db = own_store(tmp_path)
    try:
        batch_id = start_batch(db, RunSpec("recall"), [("a", "x")]).batch_id
    finally:
        db.dispose()

    # When the request is listed, then declined in bulk
    listed = alone("pending")
    declined = alone("bulk", "--decline", "no", "--agent", "agent", "--as", "dan", input="y\n")
    # ... and the batch looked at, then cancelled
    status = alone("batch", "status", batch_id)
    cancelled = alone("batch", "cancel", batch_id)

    # Then each count of one is said in the singular
    assert listed.exit_code == 0, listed.output
    assert "showing the one open request" in listed.stdout
    assert declined.exit_code == 0, declined.output
    assert "1 open request matches; to decline:" in declined.stdout
    assert "Decline (reason: no) this request?" in declined.stdout
    assert "1 request declined as dan (via cli, OS user" in declined.stdout
    assert declined.stdout.rstrip().endswith("; 1 run resumes.")
    assert status.exit_code == 0, status.output
    assert "1 job: 1 queued" in status.stdout.splitlines()
    assert "0 open requests; 0 tokens; cost 0" in status.stdout.splitlines()
    assert cancelled.exit_code == 0, cancelled.output
    assert f"batch {batch_id}: cancelled 1 run (1 queued)" in cancelled.stdout


# --- batch ---------------------------------------------------------------------------


def write_jobs(path: Path, jobs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(job) + "\n" for job in jobs))
    return path


def read_results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_batch_writes_results_in_input_order_and_a_rerun_starts_nothing(
    cli: Callable[..., Result], durable: Durable, tmp_path: Path
):
    # Given three jobs whose ids are not in sorted order
    tag = uuid.uuid4().hex
    jobs = [{"id": job_id, "prompt": f"{job_id} {tag}"} for job_id in ("c", "a", "b")]
    jobs_file = write_jobs(tmp_path / unique_name("jobs.jsonl"), jobs)
    output = tmp_path / "results.jsonl"

    # When the batch runs
    before = run_count(durable)
    first = cli("batch", "recall", str(jobs_file), "-o", str(output), "--timeout", "40")

    # Then each job has its run's outcome, in input order, and the state file names the runs
    assert first.exit_code == 0, first.output
    assert run_count(durable) == before + 3
    results = read_results(output)
    assert [r["id"] for r in results] == ["c", "a", "b"]
    assert [r["status"] for r in results] == ["done"] * 3
    assert [r["text"] for r in results] == [job["prompt"] for job in jobs]
    assert all(r["error"] is None for r in results)
    assert len({r["run_id"] for r in results}) == 3
    state = json.loads((tmp_path / "results.jsonl.runs").read_text())
    assert state["runs"] == {r["id"]: r["run_id"] for r in results}
    # ... and each run knows its batch and its job
    db = durable.db()
    stored = {r["id"]: get_run(db, r["run_id"]) for r in results}
    db.dispose()
    assert state["batch"].startswith("batch_")
    assert {job: (run.batch_id, run.job_id) for job, run in stored.items()} == {
        job: (state["batch"], job) for job in ("a", "b", "c")
    }

    # When the same command runs again, it starts nothing and writes the same results
    again = cli("batch", "recall", str(jobs_file), "-o", str(output), "--timeout", "40")
    assert again.exit_code == 0, again.output
    assert "0 started, 3 already started" in again.stderr
    assert "runs/s" not in again.stderr, "none finished while it watched"
    assert run_count(durable) == before + 3
    assert read_results(output) == results


def test_a_batch_is_known_by_its_name_not_its_output(
    cli: Callable[..., Result], durable: Durable, tmp_path: Path
):
    # Given a batch of two jobs run to its end with -o a.jsonl
    tag = uuid.uuid4().hex
    jobs_file = write_jobs(
        tmp_path / unique_name("jobs.jsonl"), [{"id": i, "prompt": f"{i} {tag}"} for i in (1, 2)]
    )
    first = cli("batch", "recall", str(jobs_file), "-o", str(tmp_path / "a.jsonl"))
    assert first.exit_code == 0, first.output
    batch_id = json.loads((tmp_path / "a.jsonl.runs").read_text())["batch"]
    before = run_count(durable)

    # When it is started again under another output, it is refused, naming the batch
    again = cli("batch", "recall", str(jobs_file), "-o", str(tmp_path / "b.jsonl"))
    assert one_error_line(again) == (
        f"relayq: error: batch {jobs_file.name!r} ({batch_id}) has run all 2 jobs of the file "
        "to its end already (2 done); for its results: relayq batch export "
        f"{batch_id}; to run them again as a new batch: --new (or another --name)"
    )
    # ... and nothing started, nor was written
    assert run_count(durable) == before
    assert not (tmp_path / "b.jsonl").exists()

    # When it is started with --new, a new batch of the same name runs both jobs again
    fresh = cli("batch", "recall", str(jobs_file), "-o", str(tmp_path / "b.jsonl"), "--new")
    assert fresh.exit_code == 0, fresh.output
    assert "2 started, 0 already started" in fresh.stderr
    assert run_count(durable) == before + 2
    new_id_ = json.loads((tmp_path / "b.jsonl.runs").read_text())["batch"]
    assert new_id_ != batch_id

    # And --name makes a batch of its own; `relayq batches` shows each by its name
    named = cli("batch", "recall", str(jobs_file), "-o", str(tmp_path / "c.jsonl"), "--name", tag)
    assert named.exit_code == 0, named.output
    listed = json.loads(cli("batches", "--agent", "recall", "--json", "--limit", "3").stdout)
    assert [b["name"] for b in listed["items"]] == [tag, jobs_file.name, jobs_file.name]


def test_a_batch_started_under_another_output_resumes_the_batch_of_its_name(
    cli: Callable[..., Result], durable: Durable, tmp_path: Path
):
    # Given a batch whose one job waits on the host, followed for a second with -o a.jsonl
    jobs_file = write_jobs(
        tmp_path / unique_name("jobs.jsonl"), [{"id": 1, "prompt": f"job {uuid.uuid4().hex}"}]
    )
    output = tmp_path / "a.jsonl"
    first = cli("batch", "lookup", str(jobs_file), "-o", str(output), "--timeout", "1")
    assert first.exit_code == 1, first.output
    batch_id = json.loads((tmp_path / "a.jsonl.runs").read_text())["batch"]
    before = run_count(durable)

    # When it is started under another output, it follows the same batch, starting nothing
    again = cli(
        "batch", "lookup", str(jobs_file), "-o", str(tmp_path / "b.jsonl"), "--timeout", "1"
    )
    assert again.exit_code == 1, again.output
    assert f"batch {jobs_file.name!r} ({batch_id}) was started before: resuming it" in again.stderr
    assert "0 started, 1 already started" in again.stderr
    assert run_count(durable) == before
    assert json.loads((tmp_path / "b.jsonl.runs").read_text())["batch"] == batch_id
    cli("batch", "cancel", batch_id)


def test_a_batch_waits_on_pending_runs_and_resumes_them_after_a_timeout(
    cli: Callable[..., Result], durable: Durable, tmp_path: Path
):
    # Given a batch whose runs all wait on the host, run with a short timeout
    tag = uuid.uuid4().hex
    jobs_file = write_jobs(
        tmp_path / unique_name("jobs.jsonl"),
        [{"id": i, "prompt": f"job {i} {tag}"} for i in (1, 2)],
    )
    output = tmp_path / "out.jsonl"
    before = run_count(durable)
    deadline = time.monotonic() + 30
    while True:  # until both runs have reached their requests within one batch's wait
        first = cli("batch", "lookup", str(jobs_file), "-o", str(output), "--timeout", "1")
        if [r["status"] for r in read_results(output)] == ["pending", "pending"]:
            break
        assert time.monotonic() < deadline, read_results(output)

    # Then it exits non-zero with the runs shown as pending, started once
    # (stderr holds the progress too: the error is its last line)
    assert first.exit_code == 1
    assert first.stderr.strip().splitlines()[-1] == (
        "relayq: error: 2 of 2 runs not finished after 1 s; "
        "run the same command again to wait on them"
    )
    assert "waiting on a person 2" in first.stderr
    pending = read_results(output)
    assert [r["id"] for r in pending] == [1, 2]
    assert run_count(durable) == before + 2

    # When the requests are answered and the batch is run again
    db = durable.db()
    try:
        for row in pending:
            (request,) = list_requests(db, run_id=row["run_id"])
            assert cli("answer", request.request.id, "--output", f"ok {row['id']}").exit_code == 0
    finally:
        db.dispose()
    again = cli("batch", "lookup", str(jobs_file), "-o", str(output), "--timeout", "40")

    # Then it re-attaches to the same runs and reports them done
    assert again.exit_code == 0, again.output
    done = read_results(output)
    assert [(r["run_id"], r["status"], r["text"]) for r in done] == [
        (pending[0]["run_id"], "done", "ok 1"),
        (pending[1]["run_id"], "done", "ok 2"),
    ]
    assert run_count(durable) == before + 2


PROMPTS_OF_100_BYTES = {"RELAYQ_MAX_ANSWER_BYTES": "100"}
BAD_JOBS = {
    "bad JSON": ('{"id": "b", "prompt": "two"', "{}:2: not valid JSON"),
    "not an object": ('["b", "two"]', "{}:2: expected an object"),
    "no id": ('{"prompt": "two"}', '{}:2: missing "id"'),
    "a bad id": ('{"id": true, "prompt": "two"}', '{}:2: "id" must be a non-empty string'),
    "no prompt": ('{"id": "b"}', "{}:2: job 'b': missing \"prompt\""),
    "an empty prompt": ('{"id": 7, "prompt": " "}', '{}:2: job 7: "prompt" must be a non-empty'),
    "a duplicate id": (
        '{"id": "a", "prompt": "again"}',
        "{}:2: job 'a': duplicate id, first on {}:1",
    ),
    "a NUL": (
        '{"id": "b", "prompt": "tw\\u0000o"}',
        "{}:2: job 'b': its prompt holds a NUL character (\\x00) at position 2, "
        "which the store cannot keep",
    ),
    "a lone surrogate": (
        '{"id": "b", "prompt": "caf\\udce9"}',
        "{}:2: job 'b': its prompt holds a lone surrogate (\\udce9) at position 3",
    ),
    "a NUL in the id": ('{"id": "b\\u0000", "prompt": "two"}', '{}:2: "id" holds a NUL'),
    "a prompt too large": (
        '{"id": "b", "prompt": "%s"}' % ("x" * 99),
        "{}:2: job 'b': its prompt is over the limit of 100 bytes of JSON "
        "(RELAYQ_MAX_ANSWER_BYTES, the limit on prompts as on answers)",
    ),
}


@pytest.mark.parametrize(("line", "complaint"), BAD_JOBS.values(), ids=BAD_JOBS.keys())
def test_a_bad_jobs_file_is_refused_whole_naming_the_line_and_job_and_starts_nothing(
    alone: Callable[..., Result], tmp_path: Path, line: str, complaint: str
):
    # Given a file whose second line is bad, and a limit of 100 bytes on prompts
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(f'{{"id": "a", "prompt": "one"}}\n{line}\n{{"id": "c", "prompt": "three"}}\n')
    output = tmp_path / "out.jsonl"

    # When the batch is started
    result = alone("batch", "recall", str(jobs), "-o", str(output), env=PROMPTS_OF_100_BYTES)

    # Then it is one line naming the file's line (and the job), and nothing was written
    assert complaint.replace("{}", str(jobs)) in one_error_line(result)
    assert not (tmp_path / "relayq.db").exists()
    assert not output.exists()
    assert not (tmp_path / "out.jsonl.runs").exists()


def test_a_prompt_at_the_limit_is_taken(alone: Callable[..., Result], tmp_path: Path):
    # 98 characters and two quotes: 100 bytes of JSON, as the limit on prompts counts them
    jobs = write_jobs(tmp_path / "jobs.jsonl", [{"id": 1, "prompt": "x" * 98}])
    env = {**PROMPTS_OF_100_BYTES, "RELAYQ_BROKER_URL": "redis://127.0.0.1:1/0"}
    result = alone("batch", "recall", str(jobs), "-o", str(tmp_path / "out.jsonl"), env=env)
    # past the file's checks, up to the broker's, which does not answer
    assert "cannot reach the broker at redis://127.0.0.1:1/0" in one_error_line(result)


def test_a_decision_on_a_relay_request_and_a_result_for_an_approval_are_refused_naming_the_way(
    cli: Callable[..., Result], durable: Durable, prompt: str
):
    # Given a run halted on its relay call, and a refund waiting on its approvers
    run_id, relay_id = halt_on_lookup(cli, prompt)
    refund = cli("run", "refunds", f"{prompt} refund", "--timeout", "30")
    assert refund.exit_code == 0, refund.output
    approval_id = request_id_in(refund.stdout)
    before = store_snapshot(durable)

    # When the relay request is approved or edited, and the approval given a result
    approved = one_error_line(cli("answer", relay_id, "--approve"))
    edited = one_error_line(cli("answer", relay_id, "--edit", "q=x"))
    output = one_error_line(cli("answer", approval_id, "--output", "yes"))

    # Then each is refused with the way to answer it, and nothing changed
    way = "answer it with --output or --results (or --decline)"
    assert approved == edited
    assert approved == (
        f"relayq: error: request {relay_id} is a tool_call request, not an approval: {way}"
    )
    assert output == (
        f"relayq: error: request {approval_id} is an approval: "
        "decide it with --approve, --edit or --decline"
    )
    assert store_snapshot(durable) == before

    # ... and the relay request still takes its result
    assert cli("answer", relay_id, "--output", "found it").exit_code == 0
    assert settle(durable, run_id, "done").text == "found it"
