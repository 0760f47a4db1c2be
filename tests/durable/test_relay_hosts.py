"""Hosts lease relay calls over HTTP (`api._relay`), on the session's worker and store.

The agent `hosted` (tests.durable.agents) asks its host to run `shell`, and
`browser_click` too when its prompt says "click", then ends with what the host
answered. Each test's runs are cancelled after it, so no test leases another's calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from api._inbox_views import when
from tasks.client import offers

from .conftest import APPROVER, SUBMITTER, TOKENS, VIEWER, ApiServer, Durable, Eventually, serve_api
from .test_api import log_in, settled_run
from .test_cli_guidance import relayq

SHELL_HOST, CLICK_HOST, ANY_HOST = "tok-host-shell", "tok-host-click", "tok-host-any"
HOST_TOKENS = (
    f"{TOKENS},laptop:host:{SHELL_HOST}:shell,tab:host:{CLICK_HOST}:browser_click,"
    f"farm:host:{ANY_HOST}:*"
)


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable, HOST_TOKENS)


@pytest.fixture
async def runs(api: ApiServer) -> AsyncIterator[list[str]]:
    """The runs a test starts; those still going are cancelled after it."""
    started: list[str] = []
    yield started
    async with api.http(SUBMITTER) as http:
        for run_id in started:
            await http.post(f"/api/runs/{run_id}/cancel")


async def start(api: ApiServer, runs: list[str], prompt: str) -> str:
    async with api.http(SUBMITTER) as http:
        res = await http.post("/api/runs", json={"agent": "hosted", "prompt": prompt})
    assert res.status_code in (200, 201), res.text
    runs.append(res.json()["id"])
    return runs[-1]


async def lease(http: httpx.AsyncClient, tools: list[str], **ask: Any) -> list[dict[str, Any]]:
    res = await http.post("/api/relay/leases", json={"tools": tools, **ask})
    assert res.status_code == 200, res.text
    leases: list[dict[str, Any]] = res.json()["leases"]
    return leases


async def lease_of(
    http: httpx.AsyncClient, run_id: str, tool: str = "shell", lease_seconds: float = 60
) -> dict[str, Any]:
    """The lease of the run's call of `tool`, waited for (others' calls are handed back)."""
    for _ in range(20):
        for held in await lease(http, [tool], wait=5, max=100, leaseSeconds=lease_seconds):
            if held["runId"] == run_id:
                return held
            await http.post(f"/api/relay/leases/{held['leaseId']}/release")
    raise AssertionError(f"no {tool} call of {run_id} was offered")


async def test_a_host_leases_the_call_answers_it_and_the_run_goes_on(
    api: ApiServer, runs: list[str], eventually: Eventually, prompt: str
):
    run_id = await start(api, runs, prompt)
    async with api.http(SHELL_HOST) as host:
        held = await lease_of(host, run_id)
        assert (held["name"], held["arguments"], held["attempt"]) == ("shell", {"cmd": prompt}, 1)
        assert {"leaseId", "requestId", "callId", "expiresAt"} <= set(held)

        res = await host.post(
            f"/api/relay/leases/{held['leaseId']}/result", json={"output": "ran it"}
        )
        assert res.status_code == 200, res.text
        assert res.json() == {"runId": run_id}

    run = await settled_run(api, run_id, eventually, "done")
    assert run["text"] == "ran it"
    async with api.http(VIEWER) as http:
        trail = (await http.get(f"/api/requests/{held['requestId']}/decisions")).json()
    assert [(d["actor"], d["role"], d["via"]) for d in trail] == [("laptop", "host", "api")]


@pytest.mark.parametrize("flag", ["yes", 1, "false", None])
async def test_a_results_is_error_is_true_or_false_or_refused_with_nothing_changed(
    api: ApiServer, runs: list[str], prompt: str, flag: object
):
    run_id = await start(api, runs, prompt)
    async with api.http(SHELL_HOST) as host:
        held = await lease_of(host, run_id)
        path = f"/api/relay/leases/{held['leaseId']}/result"
        refused = await host.post(path, json={"output": "ran it", "isError": flag})
        assert refused.status_code == 422, refused.text
        # The lease still holds its call: the same result, well formed, is taken
        taken = await host.post(path, json={"output": "ran it", "isError": False})
    assert taken.status_code == 200, taken.text


async def test_each_call_goes_to_a_host_of_its_tool_and_the_last_result_answers(
    api: ApiServer, runs: list[str], eventually: Eventually, prompt: str
):
    run_id = await start(api, runs, f"click {prompt}")
    async with api.http(SHELL_HOST) as shell, api.http(CLICK_HOST) as tab:
        by_shell = await lease_of(shell, run_id, "shell")
        by_tab = await lease_of(tab, run_id, "browser_click")
        await shell.post(f"/api/relay/leases/{by_shell['leaseId']}/result", json={"output": "ok"})
        async with api.http(VIEWER) as viewer:
            request = (await viewer.get(f"/api/requests/{by_shell['requestId']}")).json()
        assert request["status"] == "open", "one call still has no result"
        res = await tab.post(
            f"/api/relay/leases/{by_tab['leaseId']}/result",
            json={"output": "no such button", "isError": True},
        )
        assert res.status_code == 200, res.text

    run = await settled_run(api, run_id, eventually, "done")
    assert run["text"] == "ok | no such button"


async def test_a_host_serves_only_the_tools_its_token_names(
    api: ApiServer, runs: list[str], prompt: str
):
    run_id = await start(api, runs, f"click {prompt}")
    async with api.http(SHELL_HOST) as shell, api.http(ANY_HOST) as farm:
        res = await shell.post("/api/relay/leases", json={"tools": ["shell", "browser_click"]})
        assert res.status_code == 403, res.text
        assert "browser_click" in res.json()["detail"]
        # A lease of another tool, taken by a host that may serve it, is not this host's
        clicked = await lease_of(farm, run_id, "browser_click")
        for verb, body in (("result", {"output": "x"}), ("heartbeat", None), ("release", None)):
            res = await shell.post(f"/api/relay/leases/{clicked['leaseId']}/{verb}", json=body)
            assert res.status_code == 403, (verb, res.text)
        # Other roles may not lease, and a host may not read or answer
        for token in (VIEWER, APPROVER, SUBMITTER):
            async with api.http(token) as other:
                res = await other.post("/api/relay/leases", json={"tools": ["shell"]})
                assert res.status_code == 403, res.text
        assert (await shell.get("/api/runs")).status_code == 403
        res = await shell.post(
            f"/api/requests/{clicked['requestId']}/answer", json={"output": "sneaky"}
        )
        assert res.status_code == 403
    # Nothing changed: the farm's lease still holds
    async with api.http(ANY_HOST) as farm:
        res = await farm.post(f"/api/relay/leases/{clicked['leaseId']}/heartbeat")
        assert res.status_code == 200, res.text


async def test_a_lapsed_lease_is_a_409_and_its_call_comes_back_with_the_next_attempt(
    api: ApiServer, runs: list[str], eventually: Eventually, prompt: str
):
    run_id = await start(api, runs, prompt)
    async with api.http(SHELL_HOST) as host:
        # A lease of one second, left to expire: the call comes back, its attempt 2
        first = await lease_of(host, run_id, lease_seconds=1)
        second = await lease_of(host, run_id)
        assert (first["attempt"], second["attempt"]) == (1, 2)
        for verb, body in (("result", {"output": "x"}), ("heartbeat", None), ("release", None)):
            res = await host.post(f"/api/relay/leases/{first['leaseId']}/{verb}", json=body)
            assert res.status_code == 409, (verb, res.text)
        # A lease handed back: the call comes back at once, its attempt 3
        res = await host.post(f"/api/relay/leases/{second['leaseId']}/release")
        assert res.status_code == 204, res.text
        third = await lease_of(host, run_id)
        assert third["attempt"] == 3
        for verb, body in (("result", {"output": "x"}), ("heartbeat", None), ("release", None)):
            res = await host.post(f"/api/relay/leases/{second['leaseId']}/{verb}", json=body)
            assert res.status_code == 409, (verb, res.text)
            assert "released" in res.json()["detail"]
        res = await host.post(
            f"/api/relay/leases/{third['leaseId']}/result", json={"output": "third"}
        )
        assert res.status_code == 200, res.text
    assert (await settled_run(api, run_id, eventually, "done"))["text"] == "third"


async def test_a_person_answering_meanwhile_ends_the_lease(
    api: ApiServer, runs: list[str], eventually: Eventually, prompt: str
):
    run_id = await start(api, runs, prompt)
    async with api.http(SHELL_HOST) as host:
        held = await lease_of(host, run_id)
        async with api.http(APPROVER) as person:
            res = await person.post(
                f"/api/requests/{held['requestId']}/answer", json={"output": "by hand"}
            )
            assert res.status_code == 200, res.text
        res = await host.post(f"/api/relay/leases/{held['leaseId']}/result", json={"output": "x"})
        assert res.status_code == 409, res.text
    assert (await settled_run(api, run_id, eventually, "done"))["text"] == "by hand"


async def test_an_unknown_or_malformed_lease_is_refused(api: ApiServer):
    async with api.http(SHELL_HOST) as host:
        res = await host.post(f"/api/relay/leases/lease_{'0' * 32}/heartbeat")
        assert res.status_code == 404, res.text
        res = await host.post("/api/relay/leases/nope/heartbeat")
        assert res.status_code == 422, res.text
        bad: dict[str, Any]
        for bad in (
            {"tools": []},
            {"tools": ["shell"], "max": 0},
            {"tools": ["shell"], "wait": 61},
            {"tools": ["shell"], "leaseSeconds": 0.5},
            {"tools": ["shell"], "extra": 1},
        ):
            res = await host.post("/api/relay/leases", json=bad)
            assert res.status_code == 422, (bad, res.text)


async def test_a_waiting_host_is_answered_when_a_call_arrives(
    api: ApiServer, runs: list[str], prompt: str, monkeypatch: pytest.MonkeyPatch
):
    # The API looks again on its own only every ten minutes: the run's announcement, and
    # nothing else, can wake the host within its wait
    monkeypatch.setattr(offers, "RECHECK", 600.0)
    async with api.http(SHELL_HOST) as host:
        # (sent before the run starts; the run's call opens once the worker's turn ends)
        waiting = asyncio.create_task(lease(host, ["shell"], wait=30, max=1))
        run_id = await start(api, runs, prompt)
        [held] = await asyncio.wait_for(waiting, 30)
        assert held["runId"] == run_id
        res = await host.post("/api/relay/leases", json={"tools": ["shell"], "wait": 0})
        assert res.json() == {"leases": []}, "nothing left: no wait asked for"


async def test_the_api_the_inbox_and_relayq_pending_show_who_holds_a_call_and_until_when(
    api: ApiServer, runs: list[str], durable: Durable, prompt: str
):
    # Given a run whose shell call a host holds, and whose click call no host holds
    run_id = await start(api, runs, f"{prompt} click")
    async with api.http(SHELL_HOST) as host:
        held = await lease_of(host, run_id)
    until = datetime.fromisoformat(held["expiresAt"])
    request_id = held["requestId"]

    # Then the API shows the hold, on the request and in the listing
    async with api.http(VIEWER) as http:
        stored = (await http.get(f"/api/requests/{request_id}")).json()
        listed = (await http.get("/api/requests", params={"run_id": run_id})).json()
    assert [(h["callId"], h["host"], h["attempt"]) for h in stored["holds"]] == [
        ("c1", "laptop", 1)
    ]
    assert datetime.fromisoformat(stored["holds"][0]["until"]) == until
    assert listed["items"][0]["holds"] == stored["holds"]

    # ... the inbox, in its list and on the request's page, by the shell call only
    shown = f"held by laptop until {when(until)}"
    async with api.http() as browser:
        await log_in(browser, VIEWER)
        page = (await browser.get(f"/requests/{request_id}")).text
        inbox = (await browser.get("/", params={"q": prompt})).text
    assert page.count(shown) == 1, page
    assert inbox.count(shown) == 1, inbox

    # ... and `relayq pending`, in a column of its own naming the call of the two
    done = relayq("pending", "--run", run_id, env={**durable.env, "COLUMNS": "250"})
    assert done.returncode == 0, done.stderr
    assert "held by" in done.stdout
    assert f"c1: laptop until {until.astimezone(UTC):%H:%M:%SZ}" in done.stdout, done.stdout
