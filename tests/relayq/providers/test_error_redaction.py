"""A provider's error may echo the request: its status, type and message are kept, the echo not.

The local provider server answers 400 with a body that quotes the whole
request (system prompt, user prompt, earlier tool output) and a few keys,
the way some OpenAI-compatible gateways do.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from relayq import BuiltinsConfig, ModelError, ToolContext, Toolkit, create_toolkit, define_tool
from relayq.limits import ERROR_TEXT_LIMIT
from relayq.providers import ProviderClient, Style, create_client
from tests.provider_server import API_KEY, ProviderServer, Reply

from .wire import STYLES, calls_reply, toolkit, url_of

SYSTEM = "You are LedgerBot. The vault code is 4471-ALPHA-9; never reveal it to anyone."
PROMPT = "Summarise my diary: today I met Carol by the river and told her everything."
TOOL_OUTPUT = "balance of account DE89 3704 0044 0532 0130 00 is 12,345.67 EUR"
OTHER_KEY = "sk-live-9f8e7d6c5b4a39281706"
TOKEN = "AbCdEf0123456789GhIjKlMnOpQr"
SECRETS = ("4471-ALPHA", "vault code", "Carol", "river", "DE89 3704", "12,345.67",
           API_KEY, OTHER_KEY, TOKEN)  # fmt: skip


def echo(dialect: str, body: dict[str, Any]) -> Reply:
    """The `ledger` tool called first; then an error in the dialect's shape whose message
    (and other fields) quote the request, keys and all."""
    if "tool" not in json.dumps(body["messages"]):
        return calls_reply("openai" if dialect == "openai" else "anthropic", ("1", "ledger", {}))
    message = (
        f"Invalid request (auth Bearer {TOKEN}, key {OTHER_KEY}, {API_KEY}): "
        f"could not process {json.dumps(body)}"
    )
    error = {"type": "invalid_request_error", "message": message, "param": SYSTEM, "request": body}
    if dialect == "anthropic":
        return Reply({"type": "error", "error": error}, status=400)
    return Reply({"error": {**error, "code": None}}, status=400)


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.fixture(scope="module")
def echoing() -> Iterator[ProviderServer]:
    with ProviderServer(echo) as server:
        yield server


async def ledger() -> Toolkit:
    def read(args: dict[str, Any], ctx: ToolContext) -> str:
        return TOOL_OUTPUT

    tool = define_tool("ledger", "Read the ledger.", None, read)
    return await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=[tool])


@pytest.mark.parametrize("style", STYLES)
async def test_an_error_echoing_the_request_keeps_status_type_and_message_without_the_echo(
    style: Style,
    echoing: ProviderServer,
    close_later: Callable[[Any], Any],
    caplog: pytest.LogCaptureFixture,
):
    # Given a provider that answers 400 quoting the request, its prompts and keys
    caplog.set_level(logging.DEBUG)
    client = close_later(
        create_client(
            url_of(echoing, style), style, "m", api_key=API_KEY, system_prompt=SYSTEM, retries=0
        )
    )

    # When a run calls it
    with pytest.raises(ModelError) as raised:
        await client.run(PROMPT, await ledger())
    error = raised.value

    # Then the error says what happened, and holds nothing of the request nor any key
    sent = json.dumps(echoing.seen[-1].body)
    assert all(s in sent for s in SECRETS[:6]), "the request did carry what must not leak"
    assert error.status == 400
    assert not error.retryable
    text = str(error)
    assert " answered 400 (invalid_request_error): Invalid request (auth Bearer [redacted]" in text
    assert "[request text]" in text
    assert len(text) < ERROR_TEXT_LIMIT + 80
    for shown in (text, repr(error), str(pickle.loads(pickle.dumps(error)).args)):
        assert leaks(shown) == [], shown
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert leaks(logged) == [], logged


@pytest.mark.parametrize("style", STYLES)
async def test_a_plain_text_error_body_is_cut_short_and_cleaned_the_same_way(
    style: Style, server: ProviderServer, connect: Callable[..., Any]
):
    server.script[:] = [Reply(f"upstream said {OTHER_KEY}: {SYSTEM} | {PROMPT}" * 20, 502)]
    client: ProviderClient = connect(style, system_prompt=SYSTEM, retries=0)

    with pytest.raises(ModelError) as raised:
        await client.run(PROMPT, await toolkit())

    assert raised.value.status == 502
    assert raised.value.retryable
    assert str(raised.value).count("upstream said [redacted]: [request text]") >= 1
    assert len(str(raised.value)) < ERROR_TEXT_LIMIT + 80
    assert leaks(str(raised.value)) == []
