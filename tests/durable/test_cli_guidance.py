"""Never left guessing: `relayq` as a real process says what is wrong, in one line, in seconds.

No worker for a run's queue, a broker that does not answer, a bad setting, an
embedded broker whose starter died: each is said (with the command that helps),
never waited on in silence or shown as a traceback. And `--json` for scripts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli._common import warn_if_no_worker
from store import Database, OutboxRow
from store.outbox import ANSWER_TASK, unpublished
from tasks import DurableClient, Settings
from tasks.broker.publish import publish
from tests import forkserver
from tests.ports import free_port
from tests.processes import stop_group
from tests.waiting import until

from .conftest import ROOT, Broker, Durable, Worker, serving, unique_name

RELAYQ = Path(sys.executable).parent / "relayq"
AGENTS = "tests.durable.agents,tests.durable.queue_agents"
SECRET = "s3cret-never-shown"


def relayq(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`relayq ARGS` as a process, to its end."""
    return forkserver.run(
        [str(RELAYQ), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one `relayq: error:` line a refused command printed, and nothing else on stderr."""
    assert done.returncode != 0, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("relayq: error: "), lines[0]
    return lines[0]


def _base_env() -> dict[str, str]:
    """This process's environment without any RELAYQ_* a developer may have set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RELAYQ_")}


@dataclass
class Place:
    """A store and a key prefix of their own: no worker of the session sees them."""

    env: dict[str, str]
    home: Path

    @property
    def db(self) -> Database:
        return Database(self.env["RELAYQ_DATABASE_URL"])

    def worker(self, *args: str, **env: str) -> Worker:
        """A worker on this place (with `env` over its environment), started and ready."""
        log = self.home / f"worker-{uuid.uuid4().hex[:6]}.log"
        return Worker({**self.env, **env}, log).start(*args)


def new_place(root: Path, broker: Broker) -> Place:
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **_base_env(),
        "RELAYQ_HOME": str(root),
        "RELAYQ_DATABASE_URL": f"sqlite:///{root / 'relayq.db'}",
        "RELAYQ_BROKER_URL": broker.url,
        "RELAYQ_KEY_PREFIX": broker.new_prefix(),
        "RELAYQ_AGENTS": AGENTS,
        "RELAYQ_TEST_LOG": str(root / "log"),
        "COLUMNS": "250",
    }
    return Place(env, root)


@pytest.fixture
def place(tmp_path: Path, broker: Broker) -> Place:
    return new_place(tmp_path / "place", broker)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, broker: Broker) -> Iterator[Place]:
    """A place with one worker on relayq's own queues (not the `vip` agent's)."""
    place = new_place(tmp_path_factory.mktemp("served"), broker)
    worker = place.worker()
    yield place
    worker.stop()


# --- no worker for the run's queue: said within seconds, with the command that starts one ------


def test_run_with_no_worker_says_so_within_seconds_and_gives_up_at_its_timeout(place: Place):
    started = time.monotonic()
    done = relayq("run", "recall", "hello", "--timeout", "5", env=place.env)
    took = time.monotonic() - started

    warning, error = done.stderr.strip().splitlines()
    assert warning == (
        f"relayq: warning: no worker is running on {place.env['RELAYQ_BROKER_URL']} to take "
        "the turns of agent 'recall' (queue relayq.turns); start one: "
        f"relayq worker --agents {AGENTS}"
    )
    assert error.startswith("relayq: error: run run_")
    assert error.endswith(
        f"is still queued after 5 s; no worker consumes queue relayq.turns (start one: "
        f"relayq worker --agents {AGENTS})"
    )
    assert done.returncode == 1
    assert took < 20


def test_a_run_on_a_queue_no_worker_consumes_waits_until_a_worker_for_it_starts(served: Place):
    # Given a worker on relayq's queues only, and an agent whose turns go to a queue of its own
    log = served.home / f"run-{uuid.uuid4().hex[:6]}.err"
    with log.open("wb") as err:
        run = forkserver.spawn(
            [str(RELAYQ), "run", "vip", "where next", "--timeout", "90"],
            cwd=ROOT, env=served.env, stdout=subprocess.PIPE, stderr=err, start_new_session=True,
        )  # fmt: skip
    vip_worker = None
    try:
        # When it has waited a moment, it says no worker consumes that queue, and how to start one
        _wait_for(lambda: "relayq: warning:" in log.read_text(), 20, "the warning")
        assert log.read_text().splitlines() == [
            "relayq: warning: 1 worker running, none consuming queue relayq.turns.vip, where "
            "the turns of agent 'vip' go; start one: "
            f"relayq worker --agents {AGENTS} -Q relayq.turns.vip"
        ]
        # And once that worker starts, the run goes on to its relay call, and says who took it
        vip_worker = served.worker("-Q", "relayq.turns.vip", RELAYQ_TEST_WORKER="vip")
        out = run.communicate(timeout=60)[0].decode()
    finally:
        stop_group(run)
        if vip_worker is not None:
            vip_worker.stop()
    assert run.returncode == 0, out + log.read_text()
    assert log.read_text().splitlines()[-1] == "relayq: a worker took the run"
    assert "pending req_" in out


def test_a_worker_on_the_same_store_but_another_key_prefix_is_named_as_the_likely_cause(
    served: Place, broker: Broker
):
    # The served place's worker beats in this store, but listens under another prefix.
    env = {**served.env, "RELAYQ_KEY_PREFIX": broker.new_prefix()}
    done = relayq("run", "recall", "hello", "--timeout", "9", env=env)
    warning = done.stderr.strip().splitlines()[0]
    assert warning == (
        f"relayq: warning: no worker answered on {env['RELAYQ_BROKER_URL']} (key prefix "
        f"{env['RELAYQ_KEY_PREFIX']}), though 1 worker process beat in the store: busy, or "
        "using another RELAYQ_BROKER_URL or RELAYQ_KEY_PREFIX than this command"
    )
    assert done.returncode == 1


def test_warn_if_no_worker_says_whether_one_consumes_the_agents_queue(
    served: Place, capsys: pytest.CaptureFixture[str]
):
    import tests.durable.queue_agents  # noqa: F401  (registers `vip`, as known_agent would)

    settings = Settings.from_env(served.env)

    def served_quietly() -> bool:
        served = warn_if_no_worker("recall", settings)
        said = capsys.readouterr().err
        assert not served or said == "", said
        return served

    # A worker busy on a loaded machine may miss the one-second ask: asked again, it answers.
    until(served_quietly, what="the worker to answer, with no warning")

    assert warn_if_no_worker("vip", settings) is False
    assert capsys.readouterr().err == (
        "relayq: warning: 1 worker running, none consuming queue relayq.turns.vip, where the "
        f"turns of agent 'vip' go; start one: relayq worker --agents {AGENTS} -Q relayq.turns.vip\n"
    )


# --- the broker down: one line naming it, at once, and nothing started ---------------------------


def test_run_with_the_broker_down_is_one_line_naming_it_and_starts_nothing(place: Place):
    port = free_port()
    env = {**place.env, "RELAYQ_BROKER_URL": f"redis://:{SECRET}@127.0.0.1:{port}/0"}
    started = time.monotonic()
    done = relayq("run", "recall", "hello", env=env, timeout=30)

    line = error_line(done)
    assert line.startswith(
        f"relayq: error: cannot reach the broker at redis://:**@127.0.0.1:{port}/0 "
        "(RELAYQ_BROKER_URL): "
    ), line
    assert "Connection refused" in line
    assert SECRET not in done.stdout + done.stderr
    assert time.monotonic() - started < 15
    assert not (place.home / "relayq.db").exists(), "checked before the store is even opened"


def test_run_with_no_embedded_broker_running_says_a_worker_starts_it(place: Place):
    env = {k: v for k, v in place.env.items() if k != "RELAYQ_BROKER_URL"}
    line = error_line(relayq("run", "recall", "hello", env=env, timeout=30))
    assert line == (
        "relayq: error: the embedded broker is not running (RELAYQ_BROKER_URL is unset, and "
        f"nothing answers on {place.home / 'redis.sock'}); a worker starts it: "
        f"relayq worker --agents {AGENTS}"
    )


# --- the broker down once a change is stored: one warning, and the change goes on later ---------


def _down(place: Place) -> tuple[dict[str, str], str]:
    """The place's environment with a broker that does not answer, and that broker as shown."""
    port = free_port()
    env = {**place.env, "RELAYQ_BROKER_URL": f"redis://:{SECRET}@127.0.0.1:{port}/0"}
    return env, f"the broker at redis://:**@127.0.0.1:{port}/0 is not answering"


def _unsent(place: Place, run_ids: set[str]) -> list[OutboxRow]:
    """The answers' messages of these runs that the store holds and nobody has sent."""
    db = place.db
    try:
        rows = unpublished(db, older_than=timedelta(0))
        return [r for r in rows if r.run_id in run_ids and r.task == ANSWER_TASK]
    finally:
        db.dispose()


async def test_an_answer_with_the_broker_down_is_one_warning_and_reaches_the_run_once_it_is_back(
    served: Place,
):
    # Given a run waiting on its relay call
    async with DurableClient(settings=Settings.from_env(served.env)) as client:
        halted = await client.run("lookup", f"find {uuid.uuid4().hex}", timeout=30)
        assert halted.status == "pending"
        assert halted.pending is not None
        assert halted.run_id is not None
        run_id, request_id = halted.run_id, halted.pending.id

        # When it is answered from the command line while the broker does not answer
        env, down = _down(served)
        done = relayq("answer", request_id, "--output", "found it", env=env, timeout=30)

        # Then the answer is taken (exit 0), and stderr holds one warning saying so
        assert done.returncode == 0, done.stderr
        assert done.stderr.splitlines() == [
            f"relayq: warning: {down}: the answer is stored and reaches the run once the "
            "broker is back"
        ]
        assert done.stdout.startswith(f"answered {request_id} ")
        assert SECRET not in done.stdout + done.stderr
        # And the store holds the answer, and the message that applies it, not sent yet
        assert (await client.result(run_id)).status == "pending"
        unsent = _unsent(served, {run_id})
        assert [(r.task, r.args) for r in unsent] == [(ANSWER_TASK, [request_id])]

        # When the broker is back and the message goes, as a worker's sweep sends it
        publish(client.app, client.db, unsent)

        # Then the run goes on with the answer
        done_run = await client.result(run_id, wait=True, timeout=30)
        assert (done_run.status, done_run.text) == ("done", "found it")


async def test_a_bulk_decision_with_the_broker_down_is_one_warning_and_is_stored(served: Place):
    # Given two refunds waiting on their approval
    tag = f"tag{uuid.uuid4().hex[:10]}"
    prompts = [json.dumps({"order": f"{n:05d}", "amount": 10, "note": tag}) for n in range(2)]
    async with DurableClient(settings=Settings.from_env(served.env)) as client:
        run_ids = await client.start_many("desk", prompts)
        halted = [await client.result(r, wait=True, timeout=30) for r in run_ids]
    assert [r.status for r in halted] == ["pending", "pending"]

    # When both are approved in bulk while the broker does not answer
    env, down = _down(served)
    done = relayq("bulk", "--approve", "--search", tag, "--member-of", "finance", "--yes", env=env)

    # Then both are decided (exit 0), with one warning saying the runs go on later
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"relayq: warning: {down}: the answers are stored and reach their runs once the "
        "broker is back"
    ]
    assert "2 requests approved" in done.stdout
    unsent = _unsent(served, set(run_ids))
    assert sorted(str(r.run_id) for r in unsent) == sorted(run_ids)
    # (The served worker's sweep sends them once they are older than RELAYQ_OUTBOX_GRACE.)


# --- misconfiguration: one line naming the variable, for every command, never a secret ----------

_NO_DB_PORT = free_port()

CLIENTS = ["runs", "pending", "show run_x", "run recall hi"]
SERVERS = ["api", "mcp", "worker", "beat", "flower"]
EVERY = CLIENTS + SERVERS
MISCONFIGURED = [
    # (variable, value, the commands that read it, what the line says)
    ("RELAYQ_API_TOKENS", f"alice:{SECRET}:approver", ["api", "mcp"],
     "RELAYQ_API_TOKENS entry 1: its second field is not a role"),
    ("RELAYQ_API_TOKENS", f"alice:approver:{SECRET}:a:b", ["api", "mcp"],
     "RELAYQ_API_TOKENS entry 1 is not name:role:token"),
    ("RELAYQ_DATABASE_URL", f"nosuchdb://u:{SECRET}@h/db", EVERY,
     "RELAYQ_DATABASE_URL (nosuchdb://u:***@h/db) names a database relayq cannot use"),
    ("RELAYQ_DATABASE_URL", f"postgresql+psycopg://u:{SECRET}@127.0.0.1:{_NO_DB_PORT}/db",
     [*CLIENTS, "api", "mcp", "worker"],
     f"cannot use the database at postgresql+psycopg://u:***@127.0.0.1:{_NO_DB_PORT}/db "
     "(RELAYQ_DATABASE_URL): "),
    ("RELAYQ_DATABASE_URL", "not a url", EVERY, "RELAYQ_DATABASE_URL is not a database URL"),
    ("RELAYQ_BROKER_URL", f"nosuchmq://u:{SECRET}@h//", EVERY,
     "RELAYQ_BROKER_URL (nosuchmq://u:**@h//) names no broker kombu knows"),
    ("RELAYQ_BROKER_URL", f"redis://:{SECRET}@h:port/0", EVERY,
     "RELAYQ_BROKER_URL does not parse: Port could not be cast"),
    ("RELAYQ_AGENTS", "no_such_agents_module", ["run recall hi", "api", "mcp", "worker"],
     "RELAYQ_AGENTS: cannot import agent module 'no_such_agents_module': No module named"),
    ("RELAYQ_TURN_TIME_LIMIT", "ten", EVERY,
     "RELAYQ_TURN_TIME_LIMIT must be a number of seconds, not 'ten'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("variable", "value", "command", "says"),
    [
        pytest.param(variable, value, command, says, id=f"{variable}={value[:24]} {command}")
        for variable, value, commands, says in MISCONFIGURED
        for command in commands
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable_for_every_command(
    place: Place, variable: str, value: str, command: str, says: str
):
    env = {**place.env, "RELAYQ_API_TOKENS": "vic:viewer:t-guidance", variable: value}
    args = command.split()
    if args[0] in ("api", "mcp", "flower"):
        args += ["--port", str(free_port())]
    done = relayq(*args, env=env, timeout=40)
    line = error_line(done)
    assert line.startswith(f"relayq: error: {says}"), line
    assert SECRET not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


# --- the embedded broker dies with the process that started it --------------------------------


def _broker_of(home: Path) -> dict[int, str]:
    """Live processes serving `home`'s socket (the redis-server and its watchdog), by pid,
    with their program's name."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
            name = (cmdline.parent / "comm").read_text().strip()
        except (OSError, IndexError):
            continue
        if state != "Z" and any(str(home / "redis.sock").encode() in a for a in args):
            found[int(cmdline.parent.name)] = name
    return found


def _wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.05)


@pytest.fixture
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    """A place on the embedded broker (RELAYQ_BROKER_URL unset), in a short folder."""
    root = Path(f"/tmp/rq-{uuid.uuid4().hex[:8]}")  # a Unix socket's path must stay short
    env = {
        **_base_env(),
        "RELAYQ_HOME": str(root),
        "RELAYQ_DATABASE_URL": f"sqlite:///{root / 'relayq.db'}",
        "RELAYQ_AGENTS": AGENTS,
        "RELAYQ_TEST_LOG": str(root / "log"),
    }
    root.mkdir()
    yield Place(env, root)
    for pid in _broker_of(root):  # a failed test leaves none behind either
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


def _start_relayq_worker(place: Place, log: Path) -> forkserver.Proc:
    with log.open("ab") as out:
        proc = forkserver.spawn(
            [str(RELAYQ), "worker", "-c", "2", "--", "--without-mingle", "--without-gossip"],
            cwd=ROOT, env=place.env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    _wait_for(lambda: b" ready." in log.read_bytes() or proc.poll() is not None, 60, "ready")
    assert proc.poll() is None, log.read_text()[-3000:]
    return proc


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_embedded_broker_stops_when_the_worker_that_started_it_dies(
    embedded: Place, how: signal.Signals
):
    # Given `relayq worker` on the embedded broker
    worker = _start_relayq_worker(embedded, embedded.home / "worker.log")
    try:
        assert "redis-server" in _broker_of(embedded.home).values()
        # When the worker's process (not its group) is killed
        os.kill(worker.pid, how)
        worker.wait(timeout=30)
        # Then its redis-server (and watchdog) are gone within seconds, having saved what it held
        _wait_for(lambda: not _broker_of(embedded.home), 5, "the redis-server to stop")
    finally:
        stop_group(worker)
    assert "Redis is now ready to exit" in (embedded.home / "redis.log").read_text()

    # And a worker started at once gets a broker of its own and runs turns
    again = _start_relayq_worker(embedded, embedded.home / "worker-2.log")
    try:
        done = relayq("run", "recall", "after the kill", "--timeout", "30", env=embedded.env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-2:] == ["done", "after the kill"]
    finally:
        stop_group(again)
    _wait_for(lambda: not _broker_of(embedded.home), 5, "the second redis-server to stop")


# --- --json: the API's keys (camelCase) and values --------------------------------------------


@pytest.fixture(scope="module")
def api_url(durable: Durable) -> Iterator[str]:
    with serving(durable.settings, "vic:viewer:t-guidance") as server:
        yield server.url


def _api(url: str, path: str, **params: Any) -> Any:
    headers = {"Authorization": "Bearer t-guidance"}
    with httpx.Client(base_url=url, headers=headers, trust_env=False, timeout=30) as http:
        return http.get(path, params=params).raise_for_status().json()


@pytest.mark.timeout(180)  # five real commands and runs, beside five lanes
def test_runs_json_lists_the_runs_as_the_api_does(durable: Durable, api_url: str, prompt: str):
    env = {**durable.env, "COLUMNS": "250"}
    assert relayq("run", "lookup", prompt, "--timeout", "30", env=env).returncode == 0
    assert relayq("run", "recall", prompt, "--timeout", "30", env=env).returncode == 0

    done = relayq("runs", "--agent", "lookup", "--limit", "3", "--json", env=env)
    listed = json.loads(done.stdout)

    assert done.returncode == 0, done.stderr
    assert listed == _api(api_url, "/api/runs", agent="lookup", limit=3)
    assert set(listed[0]) >= {"id", "agent", "status", "conversationId", "createdAt", "updatedAt"}
    assert (listed[0]["agent"], listed[0]["status"]) == ("lookup", "pending")
    assert json.loads(relayq("runs", "--agent", "nobody", "--json", env=env).stdout) == []


def test_show_json_gives_the_run_as_the_api_does_with_its_requests(
    durable: Durable, api_url: str, prompt: str
):
    env = {**durable.env, "COLUMNS": "250"}
    started = relayq("run", "lookup", prompt, "--timeout", "30", env=env)
    run_id = started.stdout.split()[1]

    done = relayq("show", run_id, "--json", env=env)
    shown = json.loads(done.stdout)

    assert done.returncode == 0, done.stderr
    from_api = _api(api_url, f"/api/runs/{run_id}")
    assert {k: shown[k] for k in from_api} == from_api
    assert (shown["runId"], shown["agent"], shown["status"]) == (run_id, "lookup", "pending")
    assert {"createdAt", "updatedAt", "conversationId", "cancelRequested"} <= set(shown)
    [request] = shown["requests"]
    listed = _api(api_url, "/api/requests", run_id=run_id, status="open")["items"]
    assert [request] == listed
    assert request["request"]["id"] == shown["pending"]["id"]


def test_show_json_of_an_unknown_run_is_one_line(durable: Durable):
    line = error_line(relayq("show", "run_nope", "--json", env=durable.env))
    assert "run_nope" in line


# --- relayq batch: the same checks ------------------------------------------------------


def test_a_batch_with_the_broker_down_is_one_line_and_starts_nothing(place: Place):
    jobs = place.home / unique_name("jobs.jsonl")
    jobs.write_text('{"id": 1, "prompt": "hello"}\n')
    port = free_port()
    env = {**place.env, "RELAYQ_BROKER_URL": f"redis://:{SECRET}@127.0.0.1:{port}/0"}
    done = relayq("batch", "recall", str(jobs), "-o", str(place.home / "out.jsonl"), env=env)

    assert error_line(done).startswith(
        f"relayq: error: cannot reach the broker at redis://:**@127.0.0.1:{port}/0"
    )
    assert SECRET not in done.stdout + done.stderr
    assert not (place.home / "relayq.db").exists()


def test_a_batch_with_no_worker_says_so_and_waits_to_its_timeout(place: Place):
    jobs = place.home / unique_name("jobs.jsonl")
    jobs.write_text('{"id": 1, "prompt": "hello"}\n')
    out = place.home / "out.jsonl"
    done = relayq("batch", "recall", str(jobs), "-o", str(out), "--timeout", "2", env=place.env)

    assert done.returncode == 1
    assert (
        f"relayq: warning: no worker is running on {place.env['RELAYQ_BROKER_URL']} to take "
        "the turns of agent 'recall' (queue relayq.turns); start one: "
        f"relayq worker --agents {AGENTS}"
    ) in done.stderr.splitlines()
