"""The agent registry: the same definition met twice is one agent; another one is a clash.
And an agent's own policy: retries, turn time limit and queue."""

from __future__ import annotations

import importlib
import runpy
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from relayq import Agent, AgentError, InProcessResponse
from relayq.agents import DEFAULT_QUEUE, get_agent, load_agents


def model(req):
    return InProcessResponse(content="hi")


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def agent_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A module on sys.path defining one agent: (module name, agent name)."""
    name = unique("twice")
    module = f"agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from relayq import Agent, InProcessResponse\n"
        "\n"
        f"agent = Agent({name!r}, lambda req: InProcessResponse(content='x'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module, name
    sys.modules.pop(module, None)


def test_a_module_run_with_python_m_and_imported_again_registers_its_agent_without_error(
    agent_module: tuple[str, str],
):
    # Given a module run as `python -m module` (it is `__main__` then) ...
    module, name = agent_module
    as_main = runpy.run_module(module, run_name="__main__")["agent"]

    # When the worker's RELAYQ_AGENTS imports it again, under its own name
    load_agents(module)

    # Then both definitions are the same agent: no error, and the name finds the newer one
    imported = sys.modules[module].agent
    assert imported is not as_main
    assert get_agent(name) is imported


def test_a_reloaded_agent_module_registers_its_agent_again_without_error(
    agent_module: tuple[str, str],
):
    module, name = agent_module
    first = importlib.import_module(module)

    again = importlib.reload(first)

    assert get_agent(name) is again.agent


def test_registering_the_very_same_agent_object_again_is_not_an_error():
    agent = Agent(unique("same"), model, register=False)
    from relayq.agents import _register

    _register(agent)
    _register(agent)

    assert get_agent(agent.name) is agent


def test_another_agent_under_a_taken_name_is_still_an_error(
    agent_module: tuple[str, str], tmp_path: Path
):
    # Given an agent registered by one module
    module, name = agent_module
    load_agents(module)
    other = f"other_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{other}.py").write_text(
        "from relayq import Agent, InProcessResponse\n"
        f"clash = Agent({name!r}, lambda req: InProcessResponse(content='y'))\n"
    )

    # When another module defines an agent with the same name, the import fails saying where
    try:
        with pytest.raises(AgentError, match="two agents are named") as err:
            load_agents(other)
    finally:
        sys.modules.pop(other, None)
    assert f"{module}.py:3" in str(err.value)
    assert f"{other}.py:2" in str(err.value)
    assert get_agent(name) is sys.modules[module].agent, "the first keeps its name"


def test_one_factory_called_twice_with_one_name_is_an_error():
    name = unique("factory")

    def make() -> Agent:
        return Agent(name, model)

    make()
    with pytest.raises(AgentError, match="two agents are named"):
        make()


# -- policy ------------------------------------------------------------------------------------


def test_an_agents_policy_defaults_to_the_workers_settings_and_the_turn_queue():
    agent = Agent(unique("plain"), model, register=False)

    assert (agent.retries, agent.turn_time_limit, agent.queue) == (None, None, DEFAULT_QUEUE)
    assert DEFAULT_QUEUE == "relayq.turns"


def test_an_agent_takes_its_own_retries_time_limit_and_queue():
    agent = Agent(
        unique("vip"),
        model,
        retries=0,
        turn_time_limit=timedelta(seconds=30),
        queue="relayq.turns.vip",
        register=False,
    )

    assert (agent.retries, agent.turn_time_limit, agent.queue) == (
        0,
        timedelta(seconds=30),
        "relayq.turns.vip",
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"retries": -1}, "retries"),
        ({"retries": True}, "retries"),
        ({"turn_time_limit": timedelta(0)}, "turn_time_limit"),
        ({"turn_time_limit": 30}, "turn_time_limit"),
        ({"tool_timeout": timedelta(seconds=-1)}, "tool_timeout must be a positive timedelta"),
        ({"tool_timeout": 30}, "tool_timeout must be a positive timedelta"),
        ({"queue": ""}, "queue"),
        ({"queue": "relayq.turns,relayq.answers"}, "queue"),
        ({"queue": "two words"}, "queue"),
    ],
)
def test_a_bad_policy_is_refused_when_the_agent_is_defined(kwargs, message):
    with pytest.raises(AgentError, match=message):
        Agent(unique("bad"), model, register=False, **kwargs)
