"""Tools from MCP servers on real workers: an HTTP server the test starts (and restarts
mid-batch) and a stdio server each worker starts (`tests.durable.mcp_agents`)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from mcp import Client

from relayq.relay import RelayResult, relay_answer, relay_calls_of
from tasks import DurableClient
from tests.mcp_processes import ROOT, MCPServerProcess
from tests.ports import free_port

from .conftest import SQLITE_ONLY, Durable, Eventually, SpareWorkers

pytestmark = pytest.mark.timeout(180)

RUNS = 30


@pytest.fixture
def mcp_server() -> Iterator[MCPServerProcess]:
    server = MCPServerProcess(free_port()).start()
    yield server
    server.kill()


def start_worker(spare_workers: SpareWorkers, server: MCPServerProcess) -> Durable:
    return spare_workers.start(
        RELAYQ_AGENTS="tests.durable.mcp_agents",
        RELAYQ_TEST_MCP_URL=server.url,
        RELAYQ_CONCURRENCY="8",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )


def tallies(durable: Durable) -> list[str]:
    path = durable.log / "mcp.log"
    return path.read_text().splitlines() if path.exists() else []


async def test_a_batch_uses_an_http_and_a_stdio_server_and_finishes_across_a_restart(
    spare_workers: SpareWorkers, mcp_server: MCPServerProcess, eventually: Eventually
):
    # Given a worker whose agent calls a tool of each server in every run
    spare = start_worker(spare_workers, mcp_server)
    tag = uuid.uuid4().hex[:8]
    client = DurableClient(settings=spare.settings)
    try:
        # When the HTTP server is killed and started again while the batch runs
        started = await client.start_batch(
            "mcp-tools", [(f"j{i}", f"{tag}-{i}") for i in range(RUNS)]
        )
        await eventually(
            lambda: any(line.startswith(f"{tag}-") and "/web" in line for line in tallies(spare)),
            what="a first call to the HTTP server",
        )
        mcp_server.kill()
        mcp_server.start()
        results = [
            await client.result(run_id, wait=True, timeout=120)
            for run_id in await _run_ids(client, started.batch_id)
        ]
    finally:
        client.close()

    # Then every run finished, with each call's result from its server
    assert [r.status for r in results] == ["done"] * RUNS
    for result in results:
        web, box = result.text.splitlines()
        assert web.startswith("tallied"), web
        assert box.startswith("tallied"), box
    # the server's, before its restart and after
    pids = {re.search(r"pid (\d+)", r.text.splitlines()[0]).group(1) for r in results}  # type: ignore[union-attr]
    assert len(pids) == 2
    # and each call reached its server with its idempotency key
    keyed = [line for line in tallies(spare) if line.startswith(tag)]
    called = {line.split()[0] for line in keyed}
    assert called == {f"{tag}-{i}/{side}" for i in range(RUNS) for side in ("web", "box")}
    assert all(re.fullmatch(rf"{tag}-\d+/(web|box) run_\w+:1:[wb] \d+", line) for line in keyed)


async def _run_ids(client: DurableClient, batch_id: str) -> list[str]:

    rows = await client.store.batch_results(batch_id)
    return [row.id for row in rows]


@SQLITE_ONLY  # the batch runs on both stores
async def test_an_mcp_tool_declared_relay_suspends_the_run_for_the_host(
    spare_workers: SpareWorkers, mcp_server: MCPServerProcess
):
    spare = start_worker(spare_workers, mcp_server)
    client = DurableClient(settings=spare.settings)
    try:
        order = f"order-{uuid.uuid4().hex[:6]}"
        run_id = await client.start("mcp-relay", order)
        halted = await client.result(run_id, wait=True, timeout=60)
        assert halted.status == "pending"
        assert halted.pending is not None
        (call,) = relay_calls_of(halted.pending)
        assert (call.name, call.input) == ("web_ship", {"order": order})

        answer = relay_answer(halted.pending.id, [RelayResult(id=call.id, output="sent by host")])
        await client.submit_answer(answer)
        done = await client.result(run_id, wait=True, timeout=60)
    finally:
        client.close()

    assert (done.status, done.text) == ("done", "sent by host")


@SQLITE_ONLY  # the batch runs on both stores
def test_a_worker_whose_mcp_server_cannot_be_reached_stops_with_one_line_naming_it(
    durable: Durable,
):
    env = {
        **durable.env,
        "RELAYQ_AGENTS": "tests.durable.mcp_agents",
        "RELAYQ_TEST_MCP_URL": f"http://127.0.0.1:{free_port()}/mcp",
    }
    done = subprocess.run(
        [sys.executable, "-m", "workers", "worker", "--without-mingle", "--without-gossip"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("relayq: error: agent 'mcp-tools': MCP server 'web': "), line


@SQLITE_ONLY  # the batch runs on both stores
async def test_a_server_whose_tools_changed_while_a_run_was_suspended_is_reported(
    spare_workers: SpareWorkers, mcp_server: MCPServerProcess
):
    # Given a run suspended on the server's relay tool
    spare = start_worker(spare_workers, mcp_server)
    client = DurableClient(settings=spare.settings)
    try:
        run_id = await client.start("mcp-relay", f"order-{uuid.uuid4().hex[:6]}")
        halted = await client.result(run_id, wait=True, timeout=60)
        assert halted.pending is not None
        # When the server comes back with one tool more, and a new worker lists it
        mcp_server.kill()
        mcp_server.env["MCP_TEST_TOOLSET"] = "2"
        mcp_server.start()
        spare = spare_workers.restart(spare)
        (call,) = relay_calls_of(halted.pending)
        answer = relay_answer(halted.pending.id, [RelayResult(id=call.id, output="sent")])
        await client.submit_answer(answer)
        done = await client.result(run_id, wait=True, timeout=60)
    finally:
        client.close()

    # Then the run goes on (its relay tool is still there), and the change is reported
    assert done.status == "done"
    log = spare.worker.logfile.read_text()
    assert f"run {run_id} resumes with other tools than it started with" in log
    assert "MCP servers ('web')" in log


@SQLITE_ONLY
async def test_later_turns_offer_the_tool_a_server_added_under_a_running_batch(
    spare_workers: SpareWorkers, mcp_server: MCPServerProcess, eventually: Eventually
):
    # Given a batch of runs that nap a turn at a time until their server offers `grown`
    spare = start_worker(spare_workers, mcp_server)
    client = DurableClient(settings=spare.settings)
    try:
        started = await client.start_batch(
            "mcp-growing", [(f"g{i}", f"grow {i}") for i in range(8)]
        )
        await eventually(
            lambda: sum(line.startswith("nap ") for line in tallies(spare)) >= 16,
            what="the runs napping",
        )
        # When the server adds the tool, telling its clients (a client of the test's own
        # calls its `grow`)
        async with Client(mcp_server.url, cache=None) as other:
            assert (await other.call_tool("grow", {})).content[0].text == "grew"  # type: ignore[union-attr]
        results = [
            await client.result(run_id, wait=True, timeout=60)
            for run_id in await _run_ids(client, started.batch_id)
        ]
    finally:
        client.close()

    # Then the worker listed its tools again, and every run's next turn called the new one
    assert [r.status for r in results] == ["done"] * 8
    assert all(r.text.startswith("grown (pid") for r in results), [r.text for r in results]
    assert "its tools changed" in spare.worker.logfile.read_text()
