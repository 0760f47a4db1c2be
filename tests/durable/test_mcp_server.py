"""`relayq mcp`: agents served to MCP clients, as tasks and as multi round-trip calls.

Two `relayq mcp` processes on one store (a task started on one is read and answered on
the other), a worker of the test's own, and clients built with the `mcp` SDK.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import mcp_types as types
import mcp_types._v2025_11_25 as V2025
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from api.mcp._inputs import CALLS_META
from api.mcp.front import WAITING_META
from relayq.approvals import approve, edit
from store import StoredRequest
from store.audit import Decider
from tasks import DurableClient, Settings
from tests.mcp_handshake_client import RpcError, connected_at
from tests.mcp_tasks_client import (
    Task,
    cancel_task,
    connected,
    get_task,
    start_task,
    update_task,
)
from tests.ports import free_port
from tests.processes import stop_group
from tests.typescript_client import TypeScriptClient

from .conftest import (
    ROOT,
    SQLITE_ONLY,
    SUBMITTER,
    TOKENS,
    VIEWER,
    Durable,
    SpareWorkers,
    poll,
    start_api_process,
)

pytestmark = [pytest.mark.timeout(120), SQLITE_ONLY]

OTHER_SUBMITTER = "tok-sub-2"
SECRET = "a-secret-of-at-least-thirty-two-characters"
ELICIT_WAIT = 8
"""Seconds the served processes wait for an answer to an elicitation."""


@dataclass
class Served:
    spare: Durable
    urls: tuple[str, str]
    env: dict[str, str]
    """The `relayq mcp` processes' environment."""


@pytest.fixture(scope="module")
def served(durable: Durable, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    spares = SpareWorkers(durable)
    spare = spares.start(RELAYQ_AGENTS="tests.durable.agents,tests.durable.served_agents")
    env = {
        **spare.env,
        "RELAYQ_API_TOKENS": f"{TOKENS},sue:submitter:{OTHER_SUBMITTER}",
        "RELAYQ_API_SECRET": SECRET,
        "RELAYQ_MCP_ELICIT_WAIT": str(ELICIT_WAIT),
        # A call is held for its run longer than by default: an approval decided elsewhere
        # comes after the test's own polls, which a loaded machine slows down.
        "RELAYQ_MCP_HOLD": "60",
    }
    logs = tmp_path_factory.mktemp("mcp")
    ports = (free_port(), free_port())
    procs = [start_api_process(env, port, logs / f"mcp-{port}.log", "mcp") for port in ports]
    try:
        urls = tuple(f"http://127.0.0.1:{p}/mcp" for p in ports)
        yield Served(spare, urls, env)  # type: ignore[arg-type]
    finally:
        for proc in procs:
            stop_group(proc)
        for worker in spares.started:
            worker.stop()


async def until_status(client, task_id: str, *statuses: str) -> Task:
    """The task once `tasks/get` says one of `statuses` (the extension's way: clients poll)."""

    async def reached() -> Task | None:
        task = await get_task(client, task_id)
        return task if task.status in statuses else None

    found: Task = await poll(reached, timeout=60, what=f"task {task_id} to be {statuses}")
    return found


def accept(output: str) -> dict[str, object]:
    return {"action": "accept", "content": {"output": output}}


async def test_each_agent_is_a_run_tool_taking_a_prompt(served: Served):
    async with connected(served.urls[0], SUBMITTER, tasks=False) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}

    assert {"run_seed-three", "run_gated"} <= set(tools)
    assert tools["run_seed-three"].input_schema["required"] == ["prompt"]


async def test_a_task_asks_for_each_relay_call_and_completes_when_one_update_answers_them(
    served: Served,
):
    async with connected(served.urls[0], SUBMITTER, tasks=True) as client:
        created = await start_task(client, "run_seed-three", "all at once")
        # The worker may have asked already by the time the task is reported: either is true
        assert created.status in ("working", "input_required")
        asked = await until_status(client, created.task_id, "input_required")
        requests = asked.input_requests or {}
        assert set(requests) == {"c1", "c2", "c3"}
        about = (asked.meta or {})["relayq/calls"]["c1"]
        assert (about["name"], about["arguments"]) == ("alpha", {})
        assert about["schema"] == {"type": "object", "properties": {}}
        assert requests["c1"]["method"] == "elicitation/create"

        await update_task(client, created.task_id, {k: accept(k.upper()) for k in requests})
        done = await until_status(client, created.task_id, "completed")

    assert done.result == {"content": [{"type": "text", "text": "C1,C2,C3"}], "isError": False}


async def test_answers_in_two_updates_accumulate_and_a_second_process_serves_the_task(
    served: Served,
):
    # Given a task started through the first process, answered in part there
    async with connected(served.urls[0], SUBMITTER, tasks=True) as first:
        created = await start_task(first, "run_seed-three", "in two parts")
        await until_status(first, created.task_id, "input_required")
        ignored = await update_task(
            first, created.task_id, {"c1": accept("one"), "c2": accept("two")}
        )
        assert ignored == []
        # A late or racing update of a call already answered is ignored, and told so
        late = await update_task(first, created.task_id, {"c1": accept("1"), "zz": accept("?")})
        assert late == ["c1", "zz"]
    # When a client of the second process reads it and answers the rest
    async with connected(served.urls[1], SUBMITTER, tasks=True) as second:
        rest = await get_task(second, created.task_id)
        # Then it asks only for the call without a result, and completes with all three
        assert (rest.status, set(rest.input_requests or {})) == ("input_required", {"c3"})
        await update_task(second, created.task_id, {"c3": accept("three"), "c1": accept("x")})
        done = await until_status(second, created.task_id, "completed")

    assert done.result["content"][0]["text"] == "one,two,three"  # type: ignore[index]


async def decide_as_an_approver(served: Served, run_id: str, decision) -> None:
    """An approver's decision through the Python client, as the API and the inbox give it."""
    async with DurableClient(settings=Settings.from_env(served.spare.env)) as client:
        (stored,) = await poll(lambda: client.requests("open", run_id=run_id), what="a request")
        approver = Decider(name="alice", role="approver", via="api")
        await client.submit_answer(decision(stored.request.id), decider=approver, decision=True)


async def test_a_submitters_task_waits_for_an_approver_and_cannot_decide_its_own_approval(
    served: Served,
):
    async with connected(served.urls[1], SUBMITTER, tasks=True) as client:
        created = await start_task(client, "run_gated", "release it")
        # The run waits on an approval its starter may not decide: the task is working,
        # saying on what, and asks the client nothing
        waiting = await poll(
            lambda: _waiting(client, created.task_id), what="the task to wait on its approval"
        )
        assert waiting.input_requests is None
        run_id = created.task_id
        async with DurableClient(settings=Settings.from_env(served.spare.env)) as python:
            (stored,) = await python.requests("open", run_id=run_id)
        rid = stored.request.id
        assert f"waiting for an approver to decide request {rid}" == waiting.status_message

        # Approving or editing it anyway is refused, and changes nothing
        for content in ({"decision": "approve"}, {"decision": "edit", "arguments": "{}"}):
            with pytest.raises(MCPError, match="may not decide a tool_approval"):
                await update_task(client, run_id, {rid: {"action": "accept", "content": content}})
        assert (await get_task(client, run_id)).status == "working"

        # An approver decides it elsewhere: the task completes with what was approved
        await decide_as_an_approver(served, run_id, lambda rid: edit(rid, {"service": "api"}))
        done = await until_status(client, run_id, "completed")

    text = done.result["content"][0]["text"]  # type: ignore[index]
    assert text.endswith("\nreleased api")


async def _waiting(client, task_id: str) -> Task | None:
    task = await get_task(client, task_id)
    return task if task.status == "working" and task.status_message else None


async def test_without_tasks_an_approval_is_never_asked_of_its_starter_and_the_call_waits(
    served: Served,
):
    async with connected(served.urls[0], SUBMITTER, tasks=False) as client:
        # Given a call whose run comes to wait on its approval (the call started the run, so
        # it is held by the server by the time the approval is open)
        arguments = {"prompt": f"release, held {uuid.uuid4().hex}"}
        call = asyncio.create_task(
            client.session.call_tool("run_gated", arguments, allow_input_required=True)
        )
        async with DurableClient(settings=Settings.from_env(served.spare.env)) as python:

            async def waiting() -> StoredRequest | None:
                for run in await python.runs("pending", agent="gated"):
                    if await _prompt_of(python, run.id) == arguments["prompt"]:
                        found = await python.requests("open", run_id=run.id)
                        return found[0] if found else None
                return None

            stored = await poll(waiting, what="the run waiting on its approval")

        # When an approver approves it elsewhere
        await decide_as_an_approver(served, stored.run_id, approve)
        done = await asyncio.wait_for(call, 30)
        for _ in range(5):
            # The server holds a call WAIT seconds; past that (a loaded machine) it answers
            # "ask again", with nothing asked, and the client asks again, as the protocol has it.
            if not isinstance(done, types.InputRequiredResult) or done.input_requests:
                break
            done = await client.session.call_tool(
                "run_gated", arguments, request_state=done.request_state, allow_input_required=True
            )

    # Then the call, which asked its starter nothing, ends with the run
    assert isinstance(done, types.CallToolResult)
    assert done.content[0].text == "released web"  # type: ignore[union-attr]
    async with DurableClient(settings=Settings.from_env(served.spare.env)) as python:
        trail = await python.store.decisions_of(stored.request.id)
    assert [(d.actor, d.outcome) for d in trail] == [("alice", "approved")]


async def _prompt_of(client: DurableClient, run_id: str) -> str:
    result = await client.store.run_view(run_id, limit=1)
    return str(result.prompt)


async def test_a_cancelled_task_is_cancelled(served: Served):
    async with connected(served.urls[0], SUBMITTER, tasks=True) as client:
        created = await start_task(client, "run_seed-three", "never mind")
        await until_status(client, created.task_id, "input_required")

        await cancel_task(client, created.task_id)
        task = await until_status(client, created.task_id, "cancelled")

    assert task.input_requests is None


async def test_a_failed_run_is_a_failed_task_with_its_error(served: Served):
    async with connected(served.urls[0], SUBMITTER, tasks=True) as client:
        created = await start_task(client, "run_buggy", "look up order 17")
        task = await until_status(client, created.task_id, "failed", "completed")

    assert task.status == "failed"
    assert "order 17 is not in the book" in (task.error or {}).get("message", "")


async def test_tasks_methods_need_the_extension_declared(served: Served):
    async with connected(served.urls[0], SUBMITTER, tasks=True) as client:
        created = await start_task(client, "run_seed-three", "declared")
    async with connected(served.urls[0], SUBMITTER, tasks=False) as plain:
        with pytest.raises(MCPError) as refused:
            await get_task(plain, created.task_id)

    assert refused.value.error.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY


async def test_a_task_is_its_starters_alone(served: Served):
    async with connected(served.urls[0], SUBMITTER, tasks=True) as client:
        created = await start_task(client, "run_seed-three", "mine")
    async with connected(served.urls[0], OTHER_SUBMITTER, tasks=True) as other:
        with pytest.raises(MCPError, match="no task"):
            await get_task(other, created.task_id)
        with pytest.raises(MCPError, match="no task"):
            await cancel_task(other, created.task_id)


async def test_no_token_is_a_401_and_changes_nothing(served: Served):
    async with httpx.AsyncClient(trust_env=False) as http:
        reply = await http.post(
            served.urls[0], json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        )
    assert reply.status_code == 401


async def test_without_tasks_a_call_answers_input_required_and_its_retry_completes_the_run(
    served: Served,
):
    async with connected(served.urls[0], SUBMITTER, tasks=False) as client:
        arguments = {"prompt": "round trips"}
        asked = await client.session.call_tool(
            "run_seed-three", arguments, allow_input_required=True
        )
        assert isinstance(asked, types.InputRequiredResult)
        assert set(asked.input_requests or {}) == {"c1", "c2", "c3"}
        assert (asked.meta or {})["relayq/calls"]["c2"]["name"] == "beta"
        assert asked.request_state is not None
        responses: dict[str, types.InputResponse] = {
            key: types.ElicitResult(action="accept", content={"output": key})
            for key in asked.input_requests or {}
        }

        # A forged requestState is refused, and changes nothing
        forged = asked.request_state[:-4] + (
            "AAAA" if not asked.request_state.endswith("AAAA") else "BBBB"
        )
        with pytest.raises(MCPError, match="requestState"):
            await client.session.call_tool(
                "run_seed-three", arguments, input_responses=responses, request_state=forged,
                allow_input_required=True,
            )  # fmt: skip
        done = await client.session.call_tool(
            "run_seed-three", arguments, input_responses=responses,
            request_state=asked.request_state, allow_input_required=True,
        )  # fmt: skip
        assert isinstance(done, types.CallToolResult)
        assert (done.content[0].text, done.is_error) == ("c1,c2,c3", False)  # type: ignore[union-attr]

        # The same state again names a request the run no longer waits on: refused
        with pytest.raises(MCPError, match="no longer waits on"):
            await client.session.call_tool(
                "run_seed-three", arguments, input_responses=responses,
                request_state=asked.request_state, allow_input_required=True,
            )  # fmt: skip


async def test_a_request_state_given_with_another_call_or_token_is_refused_and_changes_nothing(
    served: Served,
):
    # Given a run waiting on its calls, and the state that names its request
    async with connected(served.urls[0], SUBMITTER, tasks=False) as client:
        first = {"prompt": "the first"}
        asked = await client.session.call_tool("run_seed-three", first, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult)
        state = asked.request_state
        responses: dict[str, types.InputResponse] = {
            key: types.ElicitResult(action="accept", content={"output": "x"})
            for key in asked.input_requests or {}
        }
        # When it comes back with another call (other arguments, another agent)
        for tool, arguments in (("run_seed-three", {"prompt": "another"}), ("run_gated", first)):
            with pytest.raises(MCPError, match="requestState"):
                await client.session.call_tool(
                    tool, arguments, input_responses=responses, request_state=state,
                    allow_input_required=True,
                )  # fmt: skip
    # or from another token's holder
    async with connected(served.urls[1], OTHER_SUBMITTER, tasks=False) as other:
        with pytest.raises(MCPError, match="requestState"):
            await other.session.call_tool(
                "run_seed-three", first, input_responses=responses, request_state=state,
                allow_input_required=True,
            )  # fmt: skip
        # Then the run still waits on all three calls, none answered
        async with connected(served.urls[0], SUBMITTER, tasks=False) as client:
            again = await client.session.call_tool(
                "run_seed-three", first, request_state=state, allow_input_required=True
            )
    assert isinstance(again, types.InputRequiredResult)
    assert set(again.input_requests or {}) == {"c1", "c2", "c3"}


async def test_an_sdk_client_answering_elicitations_drives_a_run_to_its_end(served: Served):
    seen: list[tuple[str, object]] = []

    async def run_it_here(context, params) -> types.ElicitResult:
        name, _, arguments = params.message.removeprefix("Run ").partition(" with ")
        seen.append((name, json.loads(arguments)))
        return types.ElicitResult(action="accept", content={"output": f"{name} ran"})

    headers = {"Authorization": f"Bearer {SUBMITTER}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http:
        transport = streamable_http_client(served.urls[1], http_client=http)
        async with Client(transport, elicitation_callback=run_it_here, cache=None) as client:
            result = await client.call_tool("run_seed-three", {"prompt": "by callback"})

    assert sorted(seen) == [("alpha", {}), ("beta", {}), ("gamma", {})]
    assert result.content[0].text == "alpha ran,beta ran,gamma ran"  # type: ignore[union-attr]


HANDSHAKE_ERA = list(HANDSHAKE_PROTOCOL_VERSIONS)
"""Every revision before 2026-07-28 the SDK negotiates: 2024-11-05 to 2025-11-25."""


@pytest.mark.parametrize("version", HANDSHAKE_ERA)
async def test_a_client_of_each_earlier_revision_gets_a_result_of_its_revision_for_each_run(
    served: Served, version: str
):
    # Given a client of an earlier revision that declares no elicitation
    async with connected_at(served.urls[0], SUBMITTER, version) as (client, _):
        assert client.negotiated == version
        # When it calls an agent whose run ends, one whose run suspends, one whose run fails
        done = await client.call_tool("run_recall", {"prompt": f"hello from {version}"})
        waits = await client.call_tool("run_seed-three", {"prompt": f"waits on {version}"})
        failed = await client.call_tool("run_buggy", {"prompt": "look up order 17"})

    # Then each is a CallToolResult as its revision has it, never input_required
    for result in (done, waits, failed):
        V2025.CallToolResult.model_validate(result)
        assert result.get("resultType", "complete") == "complete", result
    assert (done["content"][0]["text"], done.get("isError")) == (f"hello from {version}", False)
    assert failed["isError"] is True
    assert "order 17 is not in the book" in failed["content"][0]["text"]
    # and the suspended run's says, not as an error, what it waits on and where to answer it
    assert waits["isError"] is False
    about = waits["_meta"][WAITING_META]
    rid = about["request"]
    assert about["answerAt"].endswith(f"/requests/{rid}")
    text = waits["content"][0]["text"]
    assert f"is waiting on request {rid}" in text
    assert about["answerAt"] in text


async def test_a_2026_07_28_client_gets_a_result_of_its_revision_for_each_run(served: Served):
    # The revision the SDK's own client speaks, without the tasks extension, as before
    async with connected(served.urls[0], SUBMITTER, tasks=False) as client:
        call = client.session.call_tool
        done = await call("run_recall", {"prompt": "hello, 2026"}, allow_input_required=True)
        waits = await call("run_seed-three", {"prompt": "waits, 2026"}, allow_input_required=True)
        failed = await call("run_buggy", {"prompt": "order 17, 2026"}, allow_input_required=True)

    assert isinstance(done, types.CallToolResult)
    assert (done.content[0].text, done.is_error) == ("hello, 2026", False)  # type: ignore[union-attr]
    assert isinstance(waits, types.InputRequiredResult)
    assert set(waits.input_requests or {}) == {"c1", "c2", "c3"}
    assert isinstance(failed, types.CallToolResult)
    assert failed.is_error is True


ELICITING = [("2025-06-18", {"elicitation": {}}), ("2025-11-25", {"elicitation": {"form": {}}})]
"""The earlier revisions with elicitation, and how each declares form mode."""


@pytest.mark.parametrize(("version", "capabilities"), ELICITING, ids=[v for v, _ in ELICITING])
async def test_a_client_of_an_earlier_revision_is_asked_each_relay_call_inside_its_call(
    served: Served, version: str, capabilities: dict[str, Any]
):
    asked: list[dict[str, Any]] = []

    def answer(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        (about,) = params["_meta"][CALLS_META].values()
        if about["name"] == "beta" and declining:
            return {"action": "decline"}
        return {"action": "accept", "content": {"output": f"{about['name']} ran"}}

    url = served.urls[1]
    async with connected_at(url, SUBMITTER, version, capabilities=capabilities, answer=answer) as (
        client,
        _,
    ):
        # When it calls an agent whose run asks for three relay calls
        declining = False
        done = await client.call_tool("run_seed-three", {"prompt": f"elicited on {version}"})
        # Then it was asked each, a form naming the tool and its arguments, keyed by call id,
        # and its answers completed the run
        V2025.CallToolResult.model_validate(done)
        assert (done["content"][0]["text"], done["isError"]) == (
            "alpha ran,beta ran,gamma ran",
            False,
        )
        assert [p["message"] for p in asked] == [
            f"Run {n} with {{}}" for n in ("alpha", "beta", "gamma")
        ]
        assert [list(p["_meta"][CALLS_META]) for p in asked] == [["c1"], ["c2"], ["c3"]]
        assert all(p["requestedSchema"]["required"] == ["output"] for p in asked)

        # And a declined elicitation is a declined call: the run goes on without it
        declining = True
        declined = await client.call_tool("run_seed-three", {"prompt": f"declined on {version}"})
    assert declined["isError"] is False
    assert declined["content"][0]["text"] == "alpha ran,declined by the client,gamma ran"


async def test_an_elicitation_left_unanswered_ends_the_call_saying_what_the_run_waits_on(
    served: Served,
):
    # Given a client that declares elicitation and never answers one
    async with connected_at(
        served.urls[0], SUBMITTER, "2025-11-25", capabilities={"elicitation": {}},
        answer=lambda params: None,
    ) as (client, elicited):  # fmt: skip
        # When its call's run asks for a relay call
        result = await client.call_tool("run_lookup", {"prompt": "unanswered"})

    # Then, RELAYQ_MCP_ELICIT_WAIT later, the call ends: not an error, naming the request
    # the run still waits on (whose answer may come from the inbox, or a later call)
    assert len(elicited.asked) == 1
    assert result["isError"] is False
    about = result["_meta"][WAITING_META]
    assert about["status"] == "pending"
    async with DurableClient(settings=Settings.from_env(served.spare.env)) as python:
        (stored,) = await python.requests("open", run_id=about["run"])
    assert about["request"] == stored.request.id


async def test_a_session_is_its_openers_alone(served: Served):
    # Given a session of an earlier revision, opened with one submitter's token
    async with connected_at(served.urls[0], SUBMITTER, "2025-11-25") as (client, _):
        assert client.session_id is not None
        call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": "run_recall", "arguments": {"prompt": "not yours"}}}  # fmt: skip
        headers = {
            "Authorization": f"Bearer {OTHER_SUBMITTER}",
            "Mcp-Session-Id": client.session_id,
            "MCP-Protocol-Version": "2025-11-25",
            "Accept": "application/json, text/event-stream",
        }
        # When another token's holder sends a call on it
        async with httpx.AsyncClient(trust_env=False) as http:
            reply = await http.post(served.urls[0], json=call, headers=headers)

    # Then it is told there is no such session, and no run was started
    assert reply.status_code == 404
    async with DurableClient(settings=Settings.from_env(served.spare.env)) as python:
        started = await python.runs(agent="recall")
        assert all([await _prompt_of(python, r.id) != "not yours" for r in started])


async def test_a_2025_11_25_call_asking_for_a_task_is_refused_as_that_revision_says(
    served: Served,
):
    async with connected_at(served.urls[0], SUBMITTER, "2025-11-25") as (client, _):
        prompt = f"as a task {uuid.uuid4().hex}"
        with pytest.raises(RpcError) as refused:
            await client.request(
                "tools/call",
                {"name": "run_recall", "arguments": {"prompt": prompt}, "task": {"ttl": 60000}},
            )
    # -32601: the tool declares no taskSupport; and no run was started
    assert refused.value.code == types.METHOD_NOT_FOUND
    async with DurableClient(settings=Settings.from_env(served.spare.env)) as python:
        started = await python.runs(agent="recall")
        assert all([await _prompt_of(python, r.id) != prompt for r in started])


@pytest.mark.node
async def test_the_typescript_sdks_client_drives_a_run_through_an_approval_and_a_relay_call(
    served: Served, typescript: TypeScriptClient
):
    # Given the official TypeScript SDK's client (2025-11-25), declaring form elicitation,
    # calling an agent whose run waits on an approval, then on a relay call
    prompt = f"release then look up {uuid.uuid4().hex}"
    plan = {"url": served.urls[0], "token": SUBMITTER, "tool": "run_gated-lookup",
            "prompt": prompt, "elicit": True}  # fmt: skip
    call = asyncio.create_task(typescript.call(plan))
    # When an approver approves the release elsewhere while the call waits
    run_id = await _run_of(served, "gated-lookup", prompt)
    await decide_as_an_approver(served, run_id, approve)
    lines = await call

    # Then the client was asked for the relay call alone (the approval is not its
    # starter's to decide), and its call ends with the run's final text
    *elicited, last = lines
    assert "error" not in last, last
    assert last["protocolVersion"] == "2025-11-25"
    assert [list(e["elicited"]["_meta"][CALLS_META]) for e in elicited] == [["l1"]]
    assert elicited[0]["elicited"]["message"] == 'Run lookup with {"key": "web"}'
    assert last["result"]["isError"] is False
    assert last["result"]["content"][0]["text"] == "released web / lookup ran here"


@pytest.mark.node
async def test_the_typescript_sdks_client_without_elicitation_is_told_where_to_answer(
    served: Served, typescript: TypeScriptClient
):
    plan = {"url": served.urls[1], "token": SUBMITTER, "tool": "run_seed-three",
            "prompt": f"no elicitation {uuid.uuid4().hex}", "elicit": False}  # fmt: skip
    (last,) = await typescript.call(plan)

    assert "error" not in last, last
    assert last["protocolVersion"] == "2025-11-25"
    result = last["result"]
    assert result["isError"] is False
    rid = result["_meta"][WAITING_META]["request"]
    assert f"is waiting on request {rid}" in result["content"][0]["text"]


async def _run_of(served: Served, agent: str, prompt: str) -> str:
    """The run of `agent` started with `prompt`, once it is there."""
    async with DurableClient(settings=Settings.from_env(served.spare.env)) as python:

        async def started() -> str | None:
            for run in await python.runs(agent=agent):
                if await _prompt_of(python, run.id) == prompt:
                    return run.id
            return None

        run_id: str = await poll(started, what=f"the {agent} run")
        return run_id


def stdio_server(served: Served, token: str = SUBMITTER) -> dict[str, Any]:
    """`relayq mcp --stdio` as a client starts it: its command, and the environment it is
    given (the token it acts with among it)."""
    env = {**served.env, "RELAYQ_API_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    return {"command": sys.executable, "args": ["-m", "cli.main", "mcp", "--stdio"],
            "env": env, "cwd": str(ROOT)}  # fmt: skip


@pytest.mark.node
async def test_the_typescript_sdks_client_runs_an_agent_through_relayq_mcp_over_stdio(
    served: Served, typescript: TypeScriptClient
):
    # Given the TypeScript SDK's client starting `relayq mcp --stdio` itself, as desktop
    # and IDE clients start their servers, declaring form elicitation, and calling an agent
    # whose run waits on an approval, then on a relay call
    prompt = f"over stdio {uuid.uuid4().hex}"
    plan = {"stdio": stdio_server(served), "tool": "run_gated-lookup", "prompt": prompt,
            "elicit": True}  # fmt: skip
    call = asyncio.create_task(typescript.call(plan))
    # When an approver approves the release elsewhere while the call waits
    run_id = await _run_of(served, "gated-lookup", prompt)
    await decide_as_an_approver(served, run_id, approve)
    *elicited, last = await call

    # Then it listed the agents, was asked the relay call, and got the run's text
    assert "error" not in last, last
    assert "run_gated-lookup" in last["tools"]
    assert [list(e["elicited"]["_meta"][CALLS_META]) for e in elicited] == [["l1"]]
    assert last["result"]["isError"] is False
    assert last["result"]["content"][0]["text"] == "released web / lookup ran here"


async def test_relayq_mcp_over_stdio_writes_only_messages_and_ends_when_stdin_closes(
    served: Served,
):
    server = stdio_server(served)
    proc = await asyncio.create_subprocess_exec(
        server["command"], *server["args"], env=server["env"], cwd=server["cwd"],
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "pipe", "version": "1"}}}  # fmt: skip
        listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        for message in (init, {"jsonrpc": "2.0", "method": "notifications/initialized"}, listed):
            proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()
        replies = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)) for _ in "12"]
        # When its stdin closes
        proc.stdin.close()
        code = await asyncio.wait_for(proc.wait(), 30)
        rest = await proc.stdout.read()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    # Then it answered each request on stdout, wrote nothing else there, and ended cleanly
    assert [r["id"] for r in replies] == [1, 2]
    assert replies[0]["result"]["protocolVersion"] == "2025-06-18"
    assert "run_seed-three" in {t["name"] for t in replies[1]["result"]["tools"]}
    assert rest == b""
    assert code == 0


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("", "set RELAYQ_API_TOKEN"),
        ("not-a-token-of-ours", "RELAYQ_API_TOKEN is none of RELAYQ_API_TOKENS"),
        (VIEWER, "a viewer: starting runs takes a submitter's"),
    ],
    ids=["none", "unknown", "viewer"],
)
async def test_relayq_mcp_over_stdio_without_a_submitters_token_says_so_and_ends(
    served: Served, token: str, says: str
):
    server = stdio_server(served, token)
    proc = await asyncio.create_subprocess_exec(
        server["command"], *server["args"], env=server["env"], cwd=server["cwd"],
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode != 0
    assert out == b""
    assert says in err.decode()
    if token:
        assert token not in err.decode()


async def test_an_elicitation_answered_with_what_does_not_fit_is_refused_and_changes_nothing(
    served: Served,
):
    # Given a client of 2025-11-25 that answers a relay call's form with a number
    async with connected_at(
        served.urls[1], SUBMITTER, "2025-11-25", capabilities={"elicitation": {}},
        answer=lambda params: {"action": "accept", "content": {"output": 5}},
    ) as (client, elicited):  # fmt: skip
        prompt = f"a number {uuid.uuid4().hex}"
        # Then its call is refused, saying what is wrong
        with pytest.raises(RpcError) as refused:
            await client.call_tool("run_lookup", {"prompt": prompt})
    assert refused.value.code == types.INVALID_PARAMS
    assert "must have a text output" in refused.value.message
    # and the run still waits on the call, unanswered
    run_id = await _run_of(served, "lookup", prompt)
    async with DurableClient(settings=Settings.from_env(served.spare.env)) as python:
        (stored,) = await python.requests("open", run_id=run_id)
    assert stored.answer is None
    assert len(elicited.asked) == 1
