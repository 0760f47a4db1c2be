"""An Agent whose model is a ProviderConfig: in-process it retries, durably it does not."""

from __future__ import annotations

import uuid

import pytest

from relayq import Agent, InProcessRequest, ModelError
from relayq import transcript as tx
from relayq.client import InProcessClient
from relayq.loop import take_turn
from relayq.providers import ProviderConfig, ProviderModel
from tests.provider_server import API_KEY, error

from .wire import STYLES, calls_reply, text_reply, toolkit, url_of

REQUEST = InProcessRequest(messages=[{"role": "user", "content": "hi"}], tools=[])


@pytest.fixture
def make_agent(server, monkeypatch, close_later):
    monkeypatch.setenv("RELAYQ_TEST_KEY", API_KEY)

    def make(style, **options) -> Agent:
        config = ProviderConfig(
            style=style, base_url=url_of(server, style), model="m", api_key_env="RELAYQ_TEST_KEY"
        )
        agent = Agent(f"provider-{uuid.uuid4().hex[:8]}", config, register=False, **options)
        close_later(agent.model)
        close_later(agent.durable_model)
        return agent

    return make


@pytest.mark.parametrize("style", STYLES)
async def test_an_agent_on_a_provider_config_runs_in_process_with_its_tools(
    style, server, make_agent
):
    agent = make_agent(style, system_prompt="Be brief.")
    server.script += [calls_reply(style, ("a", "lookup", {"q": "x"})), text_reply(style, "Done.")]
    client = InProcessClient(
        model=agent.model, model_name=agent.model_name, system_prompt=agent.system_prompt
    )

    result = await client.run("go", await toolkit())

    assert agent.model_name == "m"
    assert result.status == "done"
    assert result.text == "Done."
    assert [t.output for t in result.tool_calls] == ["found x"]
    assert len(server.seen) == 2
    first = server.seen[0].body
    if style == "openai":
        assert first["messages"][0] == {"role": "system", "content": "Be brief."}
    else:
        assert first["system"] == "Be brief."


@pytest.mark.parametrize("style", STYLES)
async def test_an_agents_model_takes_one_turn_the_way_a_worker_does(style, server, make_agent):
    agent = make_agent(style)
    server.script.append(text_reply(style, "Hello."))

    turn = await take_turn(
        [tx.user_message("hi", "run_1")],
        await toolkit(),
        agent.durable_model,
        run_id="run_1",
        model_name=agent.model_name,
    )

    assert turn.status == "done"
    assert turn.text == "Hello."
    assert turn.model_called


@pytest.mark.parametrize("style", STYLES)
async def test_an_agents_durable_model_fails_at_once_on_a_retryable_error(
    style, server, make_agent
):
    agent = make_agent(style)
    assert isinstance(agent.durable_model, ProviderModel)
    server.script += [error(503, "down", **{"Retry-After": "3"}), text_reply(style, "ok")]

    with pytest.raises(ModelError) as raised:
        await agent.durable_model(REQUEST)

    assert raised.value.retryable is True
    assert raised.value.retry_after == 3.0, "the worker's task retry can honour the hint"
    assert len(server.seen) == 1, "the durable model did not retry"


async def test_the_same_agents_in_process_model_retries_that_error(server, make_agent):
    agent = make_agent("anthropic")
    server.script += [error(503, "down"), text_reply("anthropic", "ok")]

    reply = await agent.model(REQUEST)

    assert reply.content == "ok"
    assert len(server.seen) == 2
