"""Agents: named, registered once, loaded from modules by name."""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta

import pytest

from relayq import Agent, AgentError, BuiltinsConfig, InProcessResponse
from relayq.agents import get_agent, load_agents, registered_agents
from relayq.relay import relay_tool


def model(req):
    return InProcessResponse(content="hi")


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_an_agent_registers_under_its_name_and_is_found_again():
    name = unique("support")
    agent = Agent(name, model, request_ttl=timedelta(hours=1))
    assert get_agent(name) is agent
    assert registered_agents()[name] is agent


def test_two_agents_may_not_share_a_name():
    name = unique("twin")
    Agent(name, model)
    with pytest.raises(AgentError, match="two agents are named"):
        Agent(name, model)


def test_an_unknown_agent_is_a_clear_error_naming_the_setting():
    with pytest.raises(AgentError, match="RELAYQ_AGENTS") as err:
        get_agent("nobody-" + uuid.uuid4().hex)
    assert err.value.agent is not None


def test_load_agents_imports_modules_and_returns_their_new_agents(tmp_path, monkeypatch):
    name = unique("loaded")
    module = f"agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from relayq import Agent, InProcessResponse\n"
        f"a = Agent({name!r}, lambda req: InProcessResponse(content='x'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        loaded = load_agents(f" {module} , ")
        assert [a.name for a in loaded] == [name]
        assert load_agents([module]) == [], "importing again registers nothing new"
    finally:
        sys.modules.pop(module, None)


def test_a_missing_agent_module_is_an_agent_error():
    with pytest.raises(AgentError, match="cannot import agent module"):
        load_agents("no_such_module_" + uuid.uuid4().hex)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_turns": 0}, "max_turns"), ({"on_expiry": "explode"}, "on_expiry")],
)
def test_bad_agent_settings_are_refused(kwargs, message):
    with pytest.raises(AgentError, match=message):
        Agent(unique("bad"), model, register=False, **kwargs)


async def test_an_agents_toolkit_has_builtins_off_unless_asked_and_is_built_once():
    plain = Agent(unique("plain"), model, tools=[relay_tool("lookup", "x")], register=False)
    shell = Agent(unique("shell"), model, builtins=BuiltinsConfig.only("bash"), register=False)

    tk = await plain.toolkit()

    assert [t.name for t in tk.tools] == ["lookup"]
    assert await plain.toolkit() is tk
    assert [t.name for t in (await shell.toolkit()).tools] == ["bash"]
