"""Flower on the workers' broker: it sees each turn by its label and phase, never the prompt."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tasks import DurableClient
from tests import forkserver
from tests.durable.queue_agents import VIP_QUEUE
from tests.ports import free_port
from tests.processes import stop_group

from .conftest import ROOT, Durable, Eventually, SpareWorkers

ONE_LANE = True  # tests/conftest.py: Flower, once


@dataclass
class Flower:
    url: str
    auth: tuple[str, str]
    logfile: Path
    proc: forkserver.Proc

    async def get(self, path: str, **params: Any) -> Any:
        async with httpx.AsyncClient(auth=self.auth, timeout=5) as http:
            response = await http.get(self.url + path, params=params)
        response.raise_for_status()
        return response.json()

    async def turns_of(self, run_id: str) -> dict[str, dict[str, Any]]:
        """Flower's relayq.run_turn tasks of `run_id`, by task id."""
        tasks = await self.get("/api/tasks", taskname="relayq.run_turn")
        return {
            task_id: task
            for task_id, task in tasks.items()
            if f"run={run_id} " in (task.get("args") or "")
        }

    async def task_list(self, search: str) -> list[dict[str, Any]]:
        """The rows of Flower's /tasks page that `search` finds, as its table shows
        them: only the columns the page has, fetched as its script fetches them."""
        async with httpx.AsyncClient(auth=self.auth, timeout=5) as http:
            page = (await http.get(self.url + "/tasks")).raise_for_status().text
            columns = re.findall(r'<th data-column="([^"]+)"', page)
            params: dict[str, Any] = {
                "draw": 1, "start": 0, "length": 100, "search[value]": search,
                "order[0][column]": 0, "order[0][dir]": "desc",
            }  # fmt: skip
            params.update({f"columns[{n}][data]": name for n, name in enumerate(columns)})
            table = await http.get(self.url + "/tasks/datatable", params=params)
        rows = table.raise_for_status().json()["data"]
        return [{column: row.get(column) for column in columns} for row in rows]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthcheck", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def flower(durable: Durable) -> Iterator[Flower]:
    """`workers.flower.run` in its own process, with the workers' environment and a password."""
    port = free_port()
    password = secrets.token_urlsafe(12)
    env = {**durable.env, "RELAYQ_FLOWER_AUTH": f"ops:{password}"}
    logfile = durable.log.parent / f"flower-{port}.log"
    with logfile.open("ab") as out:
        proc = forkserver.spawn(
            [sys.executable, "-c", f"from workers.flower import run; run(port={port})"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"flower did not start:\n{logfile.read_text()[-3000:]}")
            time.sleep(0.1)
        yield Flower(url, ("ops", password), logfile, proc)
    finally:
        stop_group(proc)


async def _events_on(durable: Durable, flower: Flower, eventually: Eventually) -> None:
    """Flower hears the workers (their heartbeats reach its receiver), and has turned their
    task events on (the worker logs the first broadcast): no event is lost from here."""

    async def heard() -> bool:
        alive = await flower.get("/api/workers", status=True)
        return any(alive.values())

    await eventually(heard, timeout=20, what="flower's receiver to hear a worker")
    await eventually(
        lambda: "Events of group {task} enabled by remote" in durable.worker.logfile.read_text(),
        timeout=20,
        what="flower's enable_events broadcast to reach the worker",
    )


async def test_flower_lists_a_runs_turns_by_their_label_and_never_the_prompt(
    durable: Durable, client: DurableClient, flower: Flower, prompt: str, eventually: Eventually
):
    # Given Flower has turned the worker's task events on
    await _events_on(durable, flower, eventually)
    secret = f"{prompt}: the customer's card is 4242 4242 4242 4242"

    # When a two-turn run (a tool, then the final text) finishes
    run_id = await client.start("two-step", secret)
    assert (await client.result(run_id, wait=True, timeout=20)).status == "done"

    # Then Flower holds both of its turns, labelled with the run, agent and turn number
    turns = await eventually(
        lambda: _all_succeeded(flower, run_id, 2), what="flower to see both turns succeed"
    )
    labels = sorted(task["args"] for task in turns.values())
    assert labels == [
        f"run={run_id} agent=two-step turn=1",
        f"run={run_id} agent=two-step turn=2",
    ]
    assert {task["kwargs"] for task in turns.values()} == {"{}"}
    # ... the phase each turn's progress events reached last: saved
    assert {task["phase"] for task in turns.values()} == {"saved"}
    # ... and the prompt is nowhere in what Flower keeps or serves
    everything = [await flower.get("/api/tasks")]
    everything += [await flower.get(f"/api/task/info/{task_id}") for task_id in turns]
    for data in everything:
        assert prompt not in str(data)


async def _all_succeeded(flower: Flower, run_id: str, count: int) -> dict[str, Any] | None:
    turns = await flower.turns_of(run_id)
    states = [t["state"] for t in turns.values()]
    return turns if states == ["SUCCESS"] * count else None


async def test_flower_shows_the_phase_of_a_turn_while_it_runs(
    durable: Durable, client: DurableClient, flower: Flower, prompt: str, eventually: Eventually
):
    # Given task events are on and a run whose tool holds its turn until released
    await _events_on(durable, flower, eventually)
    run_id = await client.start("holding", prompt)
    await eventually(lambda: durable.count("tool", f"hold {run_id}") == 1, what="the tool to start")

    # Then Flower shows the turn in progress, running its tools
    async def running_tools() -> bool:
        turns = await flower.turns_of(run_id)
        return [(t["state"], t["phase"]) for t in turns.values()] == [("PROGRESS", "tools")]

    await eventually(running_tools, what="flower to show the turn running its tools")

    # When the tool is released, the run finishes and Flower shows the turn saved and done
    (durable.log / f"release-{run_id}").touch()
    assert (await client.result(run_id, wait=True, timeout=20)).status == "done"
    await eventually(lambda: _all_succeeded(flower, run_id, 2), what="flower to see both turns")


async def test_flowers_task_list_shows_each_turns_run_agent_and_number(
    durable: Durable, client: DurableClient, flower: Flower, prompt: str, eventually: Eventually
):
    # Given a two-turn run that has finished while Flower watched
    await _events_on(durable, flower, eventually)
    run_id = await client.start("two-step", prompt)
    assert (await client.result(run_id, wait=True, timeout=20)).status == "done"

    # When an operator looks for the run on Flower's task list
    async def both_listed() -> list[dict[str, Any]] | None:
        rows = await flower.task_list(run_id)
        return rows if [r.get("state") for r in rows] == ["SUCCESS"] * 2 else None

    rows = await eventually(both_listed, what="flower's task list to show both turns")

    # Then each row shows the turn's run, agent and number, and never the prompt
    assert sorted(row.get("args") or "" for row in rows) == [
        f"run={run_id} agent=two-step turn=1",
        f"run={run_id} agent=two-step turn=2",
    ]
    assert prompt not in str(rows)


async def test_a_turn_run_in_a_workers_first_moments_shows_in_flower(
    durable: Durable,
    client: DurableClient,
    flower: Flower,
    spare_workers: SpareWorkers,
    prompt: str,
    eventually: Eventually,
):
    # Given Flower is watching, and a run waits on a queue no worker consumes yet
    run_id = await client.start("vip", prompt)

    # When a worker for that queue starts (on Flower's broker) and at once runs its turns,
    # before Flower's first enable_events broadcast (every 5 s) could reach it
    env = {**durable.env, "RELAYQ_AGENTS": "tests.durable.agents,tests.durable.queue_agents"}
    spare_workers._launch(env, ("-Q", VIP_QUEUE))
    try:
        halted = await client.result(run_id, wait=True, timeout=30)
        assert halted.status == "pending", halted.error  # turn 2 asked the host to look up

        # Then Flower holds both turns all the same
        async def both_succeeded() -> dict[str, Any] | None:
            return await _all_succeeded(flower, run_id, 2)

        turns = await eventually(both_succeeded, timeout=10, what="flower to see both turns")
    finally:
        await client.cancel(run_id)
    # ... the second from when the worker sent it (the client that sent the first sends
    # no task-sent events)
    by_label = {task["args"]: task for task in turns.values()}
    assert by_label[f"run={run_id} agent=vip turn=2"]["sent"] is not None


async def test_a_failed_turn_shows_its_runtime_in_flowers_task_list(
    durable: Durable, client: DurableClient, flower: Flower, prompt: str, eventually: Eventually
):
    # Given task events are on
    await _events_on(durable, flower, eventually)

    # When a run fails in its first turn (the model refuses the request)
    run_id = await client.start("refusing", prompt)
    assert (await client.result(run_id, wait=True, timeout=20)).status == "failed"

    # Then Flower's list shows the turn failed, with how long it ran
    async def failed() -> dict[str, Any] | None:
        rows = await flower.task_list(run_id)
        return rows[0] if [r.get("state") for r in rows] == ["FAILURE"] else None

    row = await eventually(failed, what="flower's task list to show the turn failed")
    assert isinstance(row.get("runtime"), float), row
    assert 0 < row["runtime"] < 20
    assert row.get("args") == f"run={run_id} agent=refusing turn=1"


async def test_flower_refuses_requests_without_the_password(flower: Flower):
    async with httpx.AsyncClient(timeout=5) as http:
        anonymous = await http.get(flower.url + "/api/tasks")
        wrong = await http.get(flower.url + "/api/tasks", auth=("ops", "not-the-password"))
        health = await http.get(flower.url + "/healthcheck")
    assert anonymous.status_code == 401
    assert wrong.status_code == 401
    assert health.status_code == 200  # what the container's health check reads


async def test_flower_never_logs_its_password(flower: Flower):
    await flower.get("/api/workers")
    log = flower.logfile.read_text()
    assert "Visit me at" in log
    assert flower.auth[1] not in log
