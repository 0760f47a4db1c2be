"""Where a provider lives and whose key it uses: URLs, key variables, and keys that never leak."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from relayq import Agent, ModelError
from relayq.providers import ProviderConfig, ProviderModel, create_client, redact
from tests.provider_server import API_KEY, ProviderServer, Reply, error

from .conftest import unscripted
from .wire import STYLES, text_reply, toolkit, url_of

KEY_VARIABLES = ("OPENAI_API_KEY", "OPENROUTER_API_KEY", "ANTHROPIC_API_KEY", "MY_KEY")


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# -- URLs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_anthropic_adds_v1_to_the_base_url_only_when_it_is_missing(
    suffix, server, close_later
):
    server.script.append(text_reply("anthropic", "ok"))
    client = close_later(create_client(server.base + suffix, "anthropic", "m", api_key=API_KEY))

    result = await client.run("hi", await toolkit())

    assert result.text == "ok"
    assert [s.dialect for s in server.seen] == ["anthropic"], "the request hit /v1/messages"


@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
async def test_openai_posts_to_the_base_url_plus_chat_completions(suffix, server, close_later):
    server.script.append(text_reply("openai", "ok"))
    client = close_later(create_client(server.base + suffix, "openai", "m", api_key=API_KEY))

    result = await client.run("hi", await toolkit())

    assert result.text == "ok"
    assert [s.dialect for s in server.seen] == ["openai"]


async def test_openai_adds_nothing_to_the_base_url(server, close_later):
    # OpenAI-compatible servers mount the API anywhere; the base URL is taken as given.
    client = close_later(create_client(server.base, "openai", "m", api_key=API_KEY))

    with pytest.raises(ModelError) as raised:
        await client.run("hi", await toolkit())

    assert raised.value.status == 404, "posted to {base}/chat/completions, not {base}/v1/..."
    assert server.seen == []


# -- keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("style", "variables"),
    [("openai", ["OPENAI_API_KEY", "OPENROUTER_API_KEY"]), ("anthropic", ["ANTHROPIC_API_KEY"])],
)
async def test_a_missing_key_is_an_error_naming_the_variables_and_nothing_is_sent(
    style, variables, no_keys, server, connect
):
    client = connect(style, api_key=None)  # building the client is fine without a key

    with pytest.raises(ModelError) as raised:
        await client.run("hi", await toolkit())

    for name in variables:
        assert name in str(raised.value)
    assert raised.value.retryable is False
    assert server.seen == [], "no request went out without a key"


@pytest.mark.parametrize(
    ("style", "variable"),
    [
        ("openai", "OPENAI_API_KEY"),
        ("openai", "OPENROUTER_API_KEY"),
        ("anthropic", "ANTHROPIC_API_KEY"),
    ],
)
async def test_the_key_is_read_from_the_environment_when_the_call_is_made(
    style, variable, no_keys, monkeypatch, server, connect
):
    client = connect(style, api_key=None)
    monkeypatch.setenv(variable, API_KEY)  # set after the client was built
    server.script.append(text_reply(style, "ok"))

    result = await client.run("hi", await toolkit())

    assert result.text == "ok"


async def test_openai_prefers_openai_api_key_over_openrouter_api_key(
    no_keys, monkeypatch, server, connect
):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-not-this-one-000")
    server.script.append(text_reply("openai", "ok"))

    await connect("openai", api_key=None).run("hi", await toolkit())

    assert server.seen[0].headers["authorization"] == f"Bearer {API_KEY}"


@pytest.mark.parametrize("style", STYLES)
async def test_api_key_env_names_the_one_variable_to_read(
    style, no_keys, monkeypatch, server, close_later
):
    # A default variable holding a wrong key must not be used instead.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-0000000000")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-wrong-0000000000")
    config = ProviderConfig(
        style=style, base_url=url_of(server, style), model="m", api_key_env="MY_KEY"
    )
    model = close_later(ProviderModel(config))

    with pytest.raises(ModelError, match="MY_KEY") as raised:
        await model.complete([{"role": "user", "content": "hi"}])
    assert "OPENAI_API_KEY" not in str(raised.value)
    assert server.seen == []

    monkeypatch.setenv("MY_KEY", API_KEY)
    server.script.append(text_reply(style, "ok"))
    reply = await model.complete([{"role": "user", "content": "hi"}])
    assert reply.response.content == "ok"


# -- redaction --------------------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
async def test_a_key_echoed_in_an_error_body_is_redacted_from_the_error(style, server, connect):
    server.script.append(error(401, f"bad key {API_KEY}"))

    with pytest.raises(ModelError) as raised:
        await connect(style).run("hi", await toolkit())

    assert API_KEY not in str(raised.value)
    assert API_KEY not in repr(raised.value)
    assert API_KEY not in str(pickle.loads(pickle.dumps(raised.value)).args)
    assert "bad key [redacted]" in str(raised.value)
    assert raised.value.status == 401


@pytest.mark.parametrize("style", STYLES)
async def test_bearer_tokens_and_sk_keys_in_an_error_body_are_redacted(style, server, connect):
    server.script.append(
        error(500, "upstream said: Authorization: Bearer tok.EN-99 and key sk-live-abcdef123456")
    )

    with pytest.raises(ModelError) as raised:
        await connect(style, retries=0).run("hi", await toolkit())

    text = str(raised.value) + repr(raised.value)
    assert "tok.EN-99" not in text
    assert "sk-live-abcdef123456" not in text
    assert "Bearer [redacted]" in str(raised.value)


AZURE_STYLE_KEY = "0123456789abcdef0123456789abcdef"
"""A key of another shape than `sk-...`: only the exact-key rule can catch it."""


@pytest.fixture(scope="module")
def hex_key_server() -> Iterator[ProviderServer]:
    with ProviderServer(unscripted, api_key=AZURE_STYLE_KEY) as server:
        yield server


@pytest.mark.parametrize("style", STYLES)
async def test_a_key_cut_by_the_500_character_cap_on_the_error_body_does_not_leak_in_part(
    style, hex_key_server, close_later
):
    # The key starts at character 480 of the body; the message keeps 500 characters.
    hex_key_server.script[:] = [Reply("x" * 480 + AZURE_STYLE_KEY, status=401)]
    client = close_later(
        create_client(url_of(hex_key_server, style), style, "m", api_key=AZURE_STYLE_KEY)
    )

    with pytest.raises(ModelError) as raised:
        await client.run("hi", await toolkit())

    assert raised.value.status == 401
    assert AZURE_STYLE_KEY[:20] not in str(raised.value), (
        "the first 20 characters of the key leaked"
    )


@pytest.mark.parametrize(
    ("text", "secrets", "expected"),
    [
        ("key abc123xyz rejected", ("abc123xyz",), "key [redacted] rejected"),
        ("Authorization: Bearer abc.DEF-123", (), "Authorization: Bearer [redacted]"),
        ('{"auth": "bearer abc"}', (), '{"auth": "bearer [redacted]"}'),
        ("use sk-proj-AbC_123-xyz now", (), "use [redacted] now"),
        ("sk-ant-api03-abcdefgh", (), "[redacted]"),
        ("twice: k9k9k9 and k9k9k9", ("k9k9k9",), "twice: [redacted] and [redacted]"),
        ("nothing secret here", (None, ""), "nothing secret here"),
        ("a risk-assessment and a task-list", (), "a risk-assessment and a task-list"),
    ],
)
def test_redact_replaces_the_given_secrets_bearer_tokens_and_sk_keys(text, secrets, expected):
    assert redact(text, *secrets) == expected


# -- nothing secret is kept -------------------------------------------------------------------


def test_a_provider_config_has_no_field_for_a_key():
    with pytest.raises(ValidationError):
        ProviderConfig(base_url="http://h", model="m", api_key=API_KEY)  # type: ignore[call-arg]


@pytest.mark.parametrize("style", STYLES)
async def test_a_config_and_an_agent_on_it_serialise_without_the_key(
    style, monkeypatch, server, close_later
):
    monkeypatch.setenv("RELAYQ_TEST_KEY", API_KEY)
    config = ProviderConfig(
        style=style, base_url=url_of(server, style), model="m", api_key_env="RELAYQ_TEST_KEY"
    )
    agent = Agent("keyless", config, register=False)
    assert agent.provider is not None
    close_later(agent.provider)
    server.script.append(text_reply(style, "ok"))
    await agent.provider.complete([{"role": "user", "content": "hi"}])  # the key was used

    dumped = config.model_dump_json()
    assert API_KEY not in dumped
    assert "RELAYQ_TEST_KEY" in dumped
    assert ProviderConfig.model_validate_json(dumped) == config
    assert API_KEY not in agent.provider.config.model_dump_json()
    for shown in (repr(agent), repr(agent.provider), repr(agent.durable_model), repr(vars(agent))):
        assert API_KEY not in shown


async def test_a_client_given_a_key_does_not_show_it(server, connect):
    client = connect("openai", api_key=API_KEY)

    assert API_KEY not in repr(client.provider)
    assert API_KEY not in client.provider.config.model_dump_json()
