"""`relayq host` processes serving relay calls through the API: racing, killed, and
outliving an API restart, on the session's worker and store.

The agent `hosted` (tests.durable.agents) asks for `shell` with its prompt as the
command; `tests.durable.host_tools.shell` logs each execution (run, call, attempt,
pid) and holds the call first for a prompt `sleep N ...`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from tests import forkserver
from tests.ports import free_port
from tests.processes import stop_group
from tests.waiting import until

from .conftest import (
    ROOT,
    SUBMITTER,
    TOKENS,
    VIEWER,
    ApiServer,
    Durable,
    Eventually,
    serve_api,
    serve_in_thread,
    start_api_process,
    started,
)

HOST_TOKEN = "tok-host-proc"
IDLE_TOKEN = "tok-host-idle"
# `idle` serves a tool no agent calls: its lease requests always wait.
HOST_TOKENS = f"{TOKENS},desk:host:{HOST_TOKEN}:shell,idle:host:{IDLE_TOKEN}:never_called"
SHELL = "shell=tests.durable.host_tools:shell"


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable, HOST_TOKENS)


class Hosts:
    """`relayq host` processes a test starts, stopped after it."""

    def __init__(self, durable: Durable, tmp_path: Path) -> None:
        self.durable = durable
        self.tmp_path = tmp_path
        self.started: list[tuple[forkserver.Proc, Path]] = []

    def start(self, url: str, *args: str) -> tuple[forkserver.Proc, Path]:
        log = self.tmp_path / f"host-{len(self.started)}.log"
        env = {
            **self.durable.env,
            "RELAYQ_API_URL": url,
            "RELAYQ_API_TOKEN": HOST_TOKEN,
            "PYTHONUNBUFFERED": "1",
        }
        with log.open("wb") as out:
            proc = forkserver.spawn(
                [sys.executable, "-m", "cli.main", "host", "--tool", SHELL, *args],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.started.append((proc, log))
        until(lambda: started(proc, log, b"serving shell"), what="the host to start")
        return proc, log

    def stop(self) -> None:
        for proc, _ in self.started:
            stop_group(proc)


@pytest.fixture
def hosts(durable: Durable, tmp_path: Path) -> Iterator[Hosts]:
    started = Hosts(durable, tmp_path)
    yield started
    started.stop()


def executions(durable: Durable, run_ids: set[str]) -> list[tuple[str, str, int, int]]:
    """Each execution of a shell call of these runs: (run, call, attempt, host pid)."""
    path = durable.log / "host.log"
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        run_id, call_id, attempt, pid = line.split()
        if run_id in run_ids:
            found.append((run_id, call_id, int(attempt), int(pid)))
    return found


async def all_done(api: ApiServer, run_ids: list[str]) -> bool:
    async with api.http(VIEWER) as http:
        for run_id in run_ids:
            if (await http.get(f"/api/runs/{run_id}")).json()["status"] != "done":
                return False
    return True


async def test_two_hosts_racing_over_200_calls_run_each_once(
    api: ApiServer, hosts: Hosts, durable: Durable, eventually: Eventually, prompt: str
):
    # Given two host processes on the API
    for _ in range(2):
        hosts.start(api.url, "--concurrency", "16")

    # When 200 runs each ask for one shell call
    async with api.http(SUBMITTER) as http:
        run_ids = []
        for i in range(200):
            res = await http.post("/api/runs", json={"agent": "hosted", "prompt": f"{prompt} {i}"})
            run_ids.append(res.json()["id"])

    # Then every run is done with its own output, each call run exactly once, on its
    # first attempt, and both hosts took part
    await eventually(lambda: all_done(api, run_ids), timeout=120, what="all 200 runs done")
    ran = executions(durable, set(run_ids))
    assert Counter((r, c) for r, c, _, _ in ran) == Counter({(r, "c1"): 1 for r in run_ids})
    assert {attempt for _, _, attempt, _ in ran} == {1}
    assert len({pid for _, _, _, pid in ran}) == 2
    async with api.http(VIEWER) as http:
        texts = {(await http.get(f"/api/runs/{r}")).json()["text"] for r in run_ids[:5]}
    assert texts == {f"ran {prompt} {i}" for i in range(5)}


async def test_a_host_killed_holding_calls_loses_them_to_another_after_its_lease(
    api: ApiServer, hosts: Hosts, durable: Durable, eventually: Eventually, prompt: str
):
    # Given a host holding three calls in its tool (which holds a first attempt 60 s), on
    # leases of two seconds
    dying, _ = hosts.start(api.url, "--lease-seconds", "2")
    async with api.http(SUBMITTER) as http:
        run_ids = [
            (
                await http.post(
                    "/api/runs", json={"agent": "hosted", "prompt": f"sleep 60 {prompt} {i}"}
                )
            ).json()["id"]
            for i in range(3)
        ]
    await eventually(
        lambda: len(executions(durable, set(run_ids))) == 3, what="the host to hold all three"
    )

    # When it is SIGKILLed, and another host serves the tool
    os.killpg(dying.pid, signal.SIGKILL)
    dying.wait()
    survivor, _ = hosts.start(api.url)

    # Then each call is run again there, its attempt 2, and every run finishes
    await eventually(lambda: all_done(api, run_ids), timeout=60, what="the runs done")
    ran = sorted(executions(durable, set(run_ids)))
    assert [(attempt, pid) for _, _, attempt, pid in ran] == [
        (1, dying.pid), (2, survivor.pid)
    ] * 3  # fmt: skip


async def test_hosts_waiting_on_an_api_that_restarts_serve_on_after_it(
    api: ApiServer,
    hosts: Hosts,
    durable: Durable,
    eventually: Eventually,
    prompt: str,
    tmp_path: Path,
):
    # Given an API process, and a host waiting on it for calls
    port = free_port()
    first = start_api_process(api_env(durable), port, tmp_path / "api-1.log")
    try:
        host, log = hosts.start(f"http://127.0.0.1:{port}")
    finally:
        # When the API stops under the host's long poll, and starts again on its port
        stop_group(first)
    await eventually(lambda: "the API is away" in log.read_text(), what="the host to notice")
    second = start_api_process(api_env(durable), port, tmp_path / "api-2.log")
    try:
        # Then the host, the same process, serves a run started after
        async with api.http(SUBMITTER) as http:
            res = await http.post("/api/runs", json={"agent": "hosted", "prompt": prompt})
        run_id = res.json()["id"]
        await eventually(lambda: all_done(api, [run_id]), timeout=60, what="the run done")
    finally:
        stop_group(second)
    assert host.poll() is None
    assert [(c, a) for _, c, a, _ in executions(durable, {run_id})] == [("c1", 1)]


def api_env(durable: Durable) -> dict[str, str]:
    return {**durable.env, "RELAYQ_API_TOKENS": HOST_TOKENS}


async def test_an_api_asked_to_stop_answers_the_lease_requests_it_holds_with_no_call(
    durable: Durable, eventually: Eventually, tmp_path: Path
):
    # Given an API process holding a host's lease request open (nothing to offer)
    port = free_port()
    proc = start_api_process(api_env(durable), port, tmp_path / "api.log")
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {IDLE_TOKEN}"},
            timeout=httpx.Timeout(10, read=90),
            trust_env=False,
        ) as http:
            ask = {"tools": ["never_called"], "wait": 60}
            waiting = asyncio.ensure_future(http.post("/api/relay/leases", json=ask))
            await eventually(lambda: hosts_waiting(http), what="the lease request held")

            # When it is asked to stop (SIGTERM, as a deploy does)
            os.killpg(proc.pid, signal.SIGTERM)

            # Then the request is answered as at the end of its wait (the host asks the next
            # API), not cut off when the grace ends: that was a 500, which the host took for
            # a refusal and stopped on
            res = await waiting
    finally:
        stop_group(proc)
    assert res.status_code == 200, res.text
    assert res.json() == {"leases": []}


async def hosts_waiting(http: httpx.AsyncClient) -> float:
    """The API's `relayq_relay_hosts_waiting`."""
    text = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "relayq_relay_hosts_waiting":
                return sample.value
    raise AssertionError("no relayq_relay_hosts_waiting in /metrics")


class FailsTheFirstLease:
    """An API with a fault: its first lease request is a 500."""

    def __init__(self, app: object) -> None:
        self.app = app
        self.failed = False

    async def __call__(self, scope: dict, receive: object, send: object) -> None:
        if not self.failed and scope["type"] == "http" and scope["path"] == "/api/relay/leases":
            self.failed = True
            await send({"type": "http.response.start", "status": 500, "headers": []})  # type: ignore[operator]
            await send({"type": "http.response.body", "body": b"Internal Server Error"})  # type: ignore[operator]
            return
        await self.app(scope, receive, send)  # type: ignore[operator]


async def test_a_host_rides_out_an_api_error_and_serves_on(
    durable: Durable, hosts: Hosts, eventually: Eventually, prompt: str
):
    # Given an API whose first lease request fails with a 500
    app = create_app(durable.settings, tokens=HOST_TOKENS)
    app.add_middleware(FailsTheFirstLease)
    with contextmanager(serve_in_thread)(app) as api:
        # When a host starts on it
        host, log = hosts.start(api.url)

        # Then it takes the 500 for a passing fault, tries again, and serves a run
        await eventually(lambda: "the API is away (HTTP 500)" in log.read_text(), what="the 500")
        async with api.http(SUBMITTER) as http:
            res = await http.post("/api/runs", json={"agent": "hosted", "prompt": prompt})
        run_id = res.json()["id"]
        await eventually(lambda: all_done(api, [run_id]), timeout=60, what="the run done")
        assert host.poll() is None


async def test_a_result_the_api_refuses_reaches_the_model_as_an_error_once(
    api: ApiServer, hosts: Hosts, durable: Durable, eventually: Eventually
):
    # Given a host whose tool returns more than the store keeps (RELAYQ_MAX_ANSWER_BYTES)
    host, _ = hosts.start(api.url)

    # When a run asks it for that output
    async with api.http(SUBMITTER) as http:
        res = await http.post("/api/runs", json={"agent": "hosted", "prompt": "flood 1500000"})
    run_id = res.json()["id"]

    # Then the call's result is the refusal, as an error: the run goes on with it, and the
    # call is not offered again (each host would fail the same way)
    await eventually(lambda: all_done(api, [run_id]), timeout=60, what="the run done")
    async with api.http(VIEWER) as http:
        text = (await http.get(f"/api/runs/{run_id}")).json()["text"]
    assert text.startswith("the API refused the result (413)"), text[:200]
    assert [(c, a) for _, c, a, _ in executions(durable, {run_id})] == [("c1", 1)]
    assert host.poll() is None


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("surrogate", "the host could not send the tool's result: UnicodeEncodeError"),
        ("unprintable", "RuntimeError: this value has no text"),
    ],
)
async def test_a_result_the_host_cannot_send_reaches_the_model_as_an_error_once(
    api: ApiServer, hosts: Hosts, durable: Durable, eventually: Eventually, command: str,
    said: str,
):  # fmt: skip
    # Given a host whose tool returns what it cannot encode (or turn into text)
    host, log = hosts.start(api.url)

    # When a run asks it for that output
    async with api.http(SUBMITTER) as http:
        res = await http.post("/api/runs", json={"agent": "hosted", "prompt": command})
    run_id = res.json()["id"]

    # Then the call's result is an error saying why, sent once: the run goes on with it,
    # the tool ran once, and the host serves on
    await eventually(lambda: all_done(api, [run_id]), timeout=60, what="the run done")
    async with api.http(VIEWER) as http:
        text = (await http.get(f"/api/runs/{run_id}")).json()["text"]
    assert said in text, text[:300]
    assert [(c, a) for _, c, a, _ in executions(durable, {run_id})] == [("c1", 1)]
    assert host.poll() is None
    assert b"Traceback" not in log.read_bytes()
