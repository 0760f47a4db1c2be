"""Tools from MCP servers (`relayq.mcp`), against servers built with the `mcp` SDK in
processes of their own (`tests.mcp_server`): one over streamable HTTP, one over stdio."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from relayq import (
    Agent,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    Tool,
    ToolContext,
    Toolkit,
    ToolkitError,
    ToolResult,
    create_in_process_client,
)
from relayq.agents import AgentError
from relayq.approvals import approve, requires_approval
from relayq.mcp import MCPError, MCPServerHTTP, MCPServerStdio, check_servers
from relayq.mcp._tools import SENDS
from tests.durable.conftest import poll
from tests.mcp_processes import ROOT, MCPServerProcess, stdio_args
from tests.ports import free_port
from tests.typescript_client import CLIENTS, TypeScriptClient

pytestmark = pytest.mark.timeout(120)

SECRET = "Bearer s3cr3t-token"


@pytest.fixture(scope="module")
def http_server() -> Iterator[MCPServerProcess]:
    server = MCPServerProcess(free_port()).start()
    yield server
    server.kill()


def stdio(tmp_path: Path, **options: object) -> MCPServerStdio:
    env = {"RELAYQ_TEST_LOG": str(tmp_path)}
    return MCPServerStdio(sys.executable, args=stdio_args(), env=env, cwd=ROOT, **options)  # type: ignore[arg-type]


def context(name: str, *, attempt: int = 1) -> ToolContext:
    return ToolContext(
        run_id="run_x", call_id="call_1", tool_name=name, base_dir=Path("."), attempt=attempt
    )


async def call(
    toolkit: Toolkit, name: str, args: dict[str, Any], *, attempt: int = 1
) -> ToolResult:
    tool = toolkit.get(name)
    assert tool is not None, name
    result = await tool.invoke(args, context(name, attempt=attempt))
    assert isinstance(result, ToolResult)
    return result


def agent(*servers: MCPServerHTTP | MCPServerStdio) -> Agent:
    return Agent("mcp-test", lambda req: None, mcp_servers=list(servers), register=False)  # type: ignore[arg-type,return-value]


async def test_an_agent_offers_the_tools_of_an_http_and_a_stdio_server_under_their_prefixes(
    http_server: MCPServerProcess, tmp_path: Path
):
    toolkit = await agent(
        MCPServerHTTP(http_server.url, name="web"), stdio(tmp_path, name="box")
    ).toolkit()

    names = {t.name for t in toolkit.tools}
    assert {"web_add", "web_tally", "box_add", "box_tally"} <= names
    add = toolkit.get("web_add")
    assert add is not None
    assert (add.description, add.schema["required"]) == ("Add two numbers.", ["a", "b"])
    web = await call(toolkit, "web_add", {"a": 2, "b": 40})
    box = await call(toolkit, "box_add", {"a": 1, "b": 1})
    assert (web.output, web.is_error, box.output) == ("42", False, "2")


async def test_a_call_sends_its_idempotency_key_and_an_attempt_of_its_own(tmp_path: Path):
    toolkit = await agent(stdio(tmp_path)).toolkit()

    # The call's first execution, then its second (a worker died before its result was kept)
    first = await call(toolkit, "tally", {"name": "first"}, attempt=1)
    again = await call(toolkit, "tally", {"name": "first"}, attempt=2)

    # Each send carries the call's key, the same, and an attempt of its own
    assert first.output.startswith("tallied first")
    assert again.output.startswith("tallied first")
    assert (tmp_path / "mcp.log").read_text().splitlines() == [
        "first run_x:1:call_1 1",
        f"first run_x:1:call_1 {SENDS + 1}",
    ]


async def test_a_call_that_timed_out_is_not_sent_again(tmp_path: Path):
    toolkit = await agent(stdio(tmp_path, call_timeout=timedelta(seconds=0.5))).toolkit()

    result = await call(toolkit, "nap", {"seconds": 3})

    # The server got it once: it may have run, so the model is told, not the server again
    assert result.is_error
    assert "not declared safe to resend" in result.output
    assert (tmp_path / "mcp.log").read_text().splitlines() == ["nap run_x:1:call_1 1"]


async def test_a_tool_declared_safe_to_resend_is_sent_again_each_send_its_own_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("relayq.mcp._tools.backoff", lambda *_, **__: 0.0)
    server = stdio(tmp_path, call_timeout=timedelta(seconds=0.5), resend=["nap"])
    toolkit = await agent(server).toolkit()

    result = await call(toolkit, "nap", {"seconds": 3})

    assert result.is_error
    assert f"tried {SENDS} times" in result.output
    sends = (tmp_path / "mcp.log").read_text().splitlines()
    assert sends == [f"nap run_x:1:call_1 {n}" for n in range(1, SENDS + 1)]


async def test_resend_names_a_tool_the_server_lists(tmp_path: Path):
    with pytest.raises(ToolkitError, match="lists no tool 'nope' that resend= names"):
        await agent(stdio(tmp_path, resend=["nope"])).toolkit()


async def test_an_error_the_server_reports_is_an_error_result(tmp_path: Path):
    toolkit = await agent(stdio(tmp_path)).toolkit()

    result = await call(toolkit, "add", {"a": "two"})

    assert result.is_error


async def test_a_tool_named_in_relay_is_a_relay_tool_and_an_unlisted_name_is_refused(
    http_server: MCPServerProcess,
):
    toolkit = await agent(MCPServerHTTP(http_server.url, name="shop", relay=["ship"])).toolkit()
    assert toolkit.relay_names == frozenset({"shop_ship"})
    ship = toolkit.get("shop_ship")
    assert ship is not None
    assert ship.schema["required"] == ["order"]

    with pytest.raises(ToolkitError, match="lists no tool 'nope' that relay= names"):
        await agent(MCPServerHTTP(http_server.url, name="bad", relay=["nope"])).toolkit()


async def test_headers_reach_the_server_and_are_never_shown(http_server: MCPServerProcess):
    server = MCPServerHTTP(http_server.url, headers={"Authorization": SECRET})
    toolkit = await agent(server).toolkit()

    result = await call(toolkit, "whoami", {})

    assert result.output == SECRET
    assert "s3cr3t" not in f"{server!r} {server.label}"


def test_a_url_is_shown_without_its_password_or_query():
    server = MCPServerHTTP("https://user:pw@tools.example.com:8443/mcp?token=t0k")

    shown = f"{server!r} {server.label} {server.where}"

    assert server.where == "https://tools.example.com:8443/mcp"
    assert "pw" not in shown
    assert "t0k" not in shown


async def test_a_server_restarted_between_calls_is_connected_to_again(tmp_path: Path):
    server = MCPServerProcess(free_port()).start()
    try:
        toolkit = await agent(MCPServerHTTP(server.url)).toolkit()
        assert (await call(toolkit, "add", {"a": 1, "b": 2})).output == "3"
        server.kill()
        server.start()

        again = await call(toolkit, "add", {"a": 3, "b": 4})

        assert (again.output, again.is_error) == ("7", False)
    finally:
        server.kill()


async def test_a_server_that_stays_away_gives_an_error_result_after_its_tries(
    caplog: pytest.LogCaptureFixture,
):
    server = MCPServerProcess(free_port()).start()
    try:
        mcp = MCPServerHTTP(server.url, name="gone", connect_timeout=timedelta(seconds=2))
        toolkit = await agent(mcp).toolkit()
        server.kill()

        result = await call(toolkit, "gone_add", {"a": 1, "b": 2})
        # The next turn's toolkit: the tools as last listed, so the calls fail as calls.
        again = await agent(mcp).toolkit()
    finally:
        server.kill()

    assert result.is_error
    assert "MCP server 'gone'" in result.output
    assert f"tried {SENDS} times" in result.output
    assert again.get("gone_add") is not None
    assert "its tools as last listed are offered" in caplog.text


async def test_a_call_the_server_never_answers_is_given_up_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("relayq.mcp._tools.SENDS", 1)  # the bound, not the retries
    toolkit = await agent(stdio(tmp_path, call_timeout=timedelta(seconds=0.5))).toolkit()

    result = await call(toolkit, "nap", {"seconds": 30})

    assert result.is_error
    assert "no reply in 0.5 s" in result.output


async def test_a_wrapped_tool_runs_only_once_its_call_is_approved(tmp_path: Path):
    # Given the server's tally gated by an approval, and a model that calls it
    def gate(tool: Tool) -> Tool:
        return requires_approval(tool) if tool.name == "box_tally" else tool

    def model(req: InProcessRequest) -> InProcessResponse:
        outputs = [m["content"] for m in req.messages if m["role"] == "tool"]
        if outputs:
            return InProcessResponse(content=str(outputs[0]))
        call = InProcessToolCall(id="c1", name="box_tally", arguments={"name": "gated"})
        return InProcessResponse(tool_calls=[call])

    toolkit = await agent(stdio(tmp_path, name="box", wrap=gate)).toolkit()
    client = create_in_process_client(generate=model)

    # When the run asks, nothing has reached the server; once approved, the call runs
    halted = await client.run("tally it", toolkit)
    assert halted.status == "pending"
    assert halted.pending is not None
    assert halted.pending.kind == "tool_approval"
    assert not (tmp_path / "mcp.log").exists()
    done = await client.run_with_answer(
        toolkit, halted.messages, halted.pending, approve(halted.pending.id)
    )

    assert done.text.startswith("tallied gated")
    assert (tmp_path / "mcp.log").read_text().startswith("gated ")


async def test_a_wrap_that_gives_no_tool_is_refused(tmp_path: Path):
    with pytest.raises(ToolkitError, match=r"wrap\(add\) returned str, not a Tool"):
        await agent(stdio(tmp_path, wrap=lambda tool: "nope")).toolkit()


async def test_an_unreachable_server_is_one_error_naming_it():
    down = MCPServerHTTP(f"http://127.0.0.1:{free_port()}/mcp", name="nowhere")

    with pytest.raises(MCPError) as caught:
        await check_servers([down])

    assert str(caught.value).startswith("MCP server 'nowhere': ")
    assert "\n" not in str(caught.value)


async def test_a_changed_tool_list_changes_the_toolkits_digest(tmp_path: Path):
    before = await agent(stdio(tmp_path)).toolkit()
    after = await agent(
        MCPServerStdio(sys.executable, args=stdio_args(), env={"MCP_TEST_TOOLSET": "2"}, cwd=ROOT)
    ).toolkit()

    assert after.get("extra") is not None
    assert before.digest() != after.digest()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: MCPServerHTTP("ftp://host/mcp"), "must start with http:// or https://"),
        (lambda: MCPServerHTTP("http://h/mcp", name="a b"), "must be 1-32 letters"),
        (lambda: MCPServerHTTP("http://h/mcp", relay="ship"), "relay must be a list"),
        (
            lambda: MCPServerStdio("x", call_timeout=timedelta(0)),
            "timeouts must be positive",
        ),
        (lambda: MCPServerStdio(""), "must be a program"),
    ],
)
def test_a_bad_server_definition_is_refused(make, says: str):
    with pytest.raises(ToolkitError, match=says):
        make()


def test_an_agent_refuses_what_is_not_an_mcp_server_and_two_servers_of_one_name():
    with pytest.raises(AgentError, match="mcp_servers must be a list"):
        Agent("x", lambda r: None, mcp_servers=["http://h/mcp"], register=False)  # type: ignore[list-item,arg-type,return-value]
    twice = [MCPServerHTTP("http://a/mcp", name="s"), MCPServerHTTP("http://b/mcp", name="s")]
    with pytest.raises(AgentError, match="two of its MCP servers have one name"):
        Agent("x", lambda r: None, mcp_servers=twice, register=False)  # type: ignore[arg-type,return-value]


@pytest.mark.node
async def test_a_servers_notification_that_its_tools_changed_is_followed(
    typescript: TypeScriptClient,
):
    # Given an agent whose server, built with the TypeScript SDK, speaks 2025-11-25 at most
    # (its changes come as notifications/tools/list_changed)
    server = MCPServerStdio("node", args=[str(CLIENTS / "server.mjs")], cwd=CLIENTS, name="ts")
    first = await agent(server).toolkit()
    assert {t.name for t in first.tools} == {"ts_grow"}

    # When a call of its `grow` adds a tool
    assert (await call(first, "ts_grow", {})).output == "grew"

    # Then the next toolkit offers it, without a new connection, and it can be called
    async def offered() -> Toolkit | None:
        toolkit = await agent(server).toolkit()
        return toolkit if toolkit.get("ts_grown") is not None else None

    later = await poll(offered, what="the new tool offered")
    assert (await call(later, "ts_grown", {})).output.startswith("grown (pid")
