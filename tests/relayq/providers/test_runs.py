"""A run on a real provider, in each dialect: answers, tool calls, relay halts and resumes."""

from __future__ import annotations

import json

import pytest

from relayq import RunResult, Usage
from relayq.relay import RelayResult, answer_output, relay_answer, relay_calls_of
from tests.provider_server import API_KEY, Reply

from .wire import (
    CALLS_USAGE,
    STYLES,
    TEXT_USAGE,
    call_id,
    calls_reply,
    text_reply,
    tool_results,
    toolkit,
)


@pytest.mark.parametrize("style", STYLES)
async def test_a_plain_answer_finishes_the_run_with_the_providers_text_and_usage(
    style, server, connect
):
    server.script.append(text_reply(style, "Hello there."))
    client = connect(style, system_prompt="Be brief.")

    result = await client.run("hi", await toolkit())

    assert result.status == "done"
    assert result.text == "Hello there."
    assert result.turns == 1
    prompt, completion, total = TEXT_USAGE[style]
    assert result.usage == Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=total
    )
    assert len(server.seen) == 1


async def test_an_openai_request_carries_the_bearer_key_model_system_message_and_function_tools(
    server, connect
):
    server.script.append(text_reply("openai", "ok"))

    await connect("openai", system_prompt="Be brief.").run("hi", await toolkit())

    (seen,) = server.seen
    assert seen.dialect == "openai"
    assert seen.headers["authorization"] == f"Bearer {API_KEY}"
    assert seen.body["model"] == "m"
    assert seen.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    lookup = next(t for t in seen.body["tools"] if t["function"]["name"] == "lookup")
    assert lookup["type"] == "function"
    assert lookup["function"]["parameters"]["required"] == ["q"]
    assert {t["function"]["name"] for t in seen.body["tools"]} == {"lookup", "explode", "deploy"}
    assert "max_tokens" not in seen.body, "openai gets max_tokens only when it is set"


async def test_an_anthropic_request_carries_the_key_version_system_field_tools_and_max_tokens(
    server, connect
):
    server.script.append(text_reply("anthropic", "ok"))

    await connect("anthropic", system_prompt="Be brief.").run("hi", await toolkit())

    (seen,) = server.seen
    assert seen.dialect == "anthropic"
    assert seen.headers["x-api-key"] == API_KEY
    assert seen.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in seen.headers
    assert seen.body["model"] == "m"
    assert seen.body["system"] == "Be brief."
    assert seen.body["max_tokens"] == 4096
    assert seen.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    lookup = next(t for t in seen.body["tools"] if t["name"] == "lookup")
    assert set(lookup) == {"name", "description", "input_schema"}
    assert lookup["input_schema"]["required"] == ["q"]
    assert {t["name"] for t in seen.body["tools"]} == {"lookup", "explode", "deploy"}


@pytest.mark.parametrize("style", STYLES)
async def test_max_tokens_and_extra_headers_from_the_client_reach_the_provider(
    style, server, connect
):
    server.script.append(text_reply(style, "ok"))

    await connect(style, max_tokens=256, headers={"HTTP-Referer": "https://relayq.test"}).run(
        "hi", await toolkit()
    )

    (seen,) = server.seen
    assert seen.body["max_tokens"] == 256
    assert seen.headers["http-referer"] == "https://relayq.test"


@pytest.mark.parametrize("style", STYLES)
async def test_two_parallel_tool_calls_both_run_and_both_results_go_back_in_call_order(
    style, server, connect
):
    # Given a reply with two local calls, the second of which fails
    server.script += [
        calls_reply(style, ("one", "lookup", {"q": "tides"}), ("two", "explode", {})),
        text_reply(style, "All done."),
    ]
    counts: dict[str, int] = {}

    # When the run goes on
    result = await connect(style).run("go", await toolkit(counts))

    # Then both tools ran once, and the next request answered both calls
    assert result.status == "done"
    assert result.text == "All done."
    assert counts == {"lookup": 1, "explode": 1}
    assert len(server.seen) == 2
    results = tool_results(style, server.seen[1].body)
    assert [r["id"] for r in results] == [call_id(style, "one"), call_id(style, "two")]
    assert results[0]["content"] == "found tides"
    assert "boom" in results[1]["content"]
    assert [(t.name, t.is_error) for t in result.tool_calls] == [
        ("lookup", False),
        ("explode", True),
    ]
    assert result.turns == 2
    assert result.usage.total_tokens == CALLS_USAGE[style][2] + TEXT_USAGE[style][2]
    assert result.usage.prompt_tokens == CALLS_USAGE[style][0] + TEXT_USAGE[style][0]


async def test_anthropic_gets_both_results_in_one_user_turn_with_the_failure_flagged(
    server, connect
):
    server.script += [
        calls_reply("anthropic", ("one", "lookup", {"q": "tides"}), ("two", "explode", {})),
        text_reply("anthropic", "All done."),
    ]

    await connect("anthropic").run("go", await toolkit())

    messages = server.seen[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "toolu_one", "name": "lookup", "input": {"q": "tides"}},
        {"type": "tool_use", "id": "toolu_two", "name": "explode", "input": {}},
    ]
    first, second = messages[2]["content"]
    assert first == {"type": "tool_result", "tool_use_id": "toolu_one", "content": "found tides"}
    assert second["tool_use_id"] == "toolu_two"
    assert second["is_error"] is True


async def test_openai_gets_one_tool_message_per_call_after_the_assistant_tool_calls(
    server, connect
):
    server.script += [
        calls_reply("openai", ("one", "lookup", {"q": "tides"}), ("two", "explode", {})),
        text_reply("openai", "All done."),
    ]

    await connect("openai").run("go", await toolkit())

    messages = server.seen[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_one", "call_two"]
    assert json.loads(messages[1]["tool_calls"][0]["function"]["arguments"]) == {"q": "tides"}
    assert [m["tool_call_id"] for m in messages[2:]] == ["call_one", "call_two"]
    assert all(set(m) == {"role", "tool_call_id", "content"} for m in messages[2:]), (
        "relayq's notes never reach the wire"
    )


@pytest.mark.parametrize("style", STYLES)
async def test_a_relay_call_halts_with_a_request_carrying_the_providers_call_id(
    style, server, connect
):
    server.script.append(calls_reply(style, ("abc", "deploy", {"service": "web"})))

    halted = await connect(style).run("ship it", await toolkit())

    assert halted.status == "pending"
    assert halted.pending is not None
    assert halted.pending.kind == "tool_call"
    (relayed,) = relay_calls_of(halted.pending)
    assert relayed.id == call_id(style, "abc")
    assert relayed.name == "deploy"
    assert relayed.input == {"service": "web"}
    assert len(server.seen) == 1, "a halted run does not call the model again"


@pytest.mark.parametrize("style", STYLES)
async def test_an_answer_resumes_a_relay_halt_with_the_hosts_output_in_a_valid_request(
    style, server, connect
):
    # Given a run halted on a relay call
    server.script += [
        calls_reply(style, ("abc", "deploy", {"service": "web"})),
        text_reply(style, "Shipped."),
    ]
    client = connect(style)
    kit = await toolkit()
    halted = await client.run("ship it", kit)
    assert halted.pending is not None

    # When the host answers
    done = await client.run_with_answer(
        kit, halted.messages, halted.pending, answer_output(halted.pending.id, "deployed web")
    )

    # Then the server accepted the next request and it carried the output
    assert done.status == "done"
    assert done.text == "Shipped."
    assert tool_results(style, server.seen[1].body) == [
        {"id": call_id(style, "abc"), "content": "deployed web", "is_error": False}
    ]
    assert "waiting for the host" not in json.dumps(server.seen[1].body)


@pytest.mark.parametrize("style", STYLES)
async def test_a_halted_transcript_saved_as_json_resumes_on_a_fresh_client(style, server, connect):
    # Given a relay call and a local call in one turn, halted and saved as JSON
    server.script += [
        calls_reply(style, ("abc", "deploy", {"service": "web"}), ("def", "lookup", {"q": "x"})),
        text_reply(style, "Shipped."),
    ]
    kit = await toolkit()
    halted = await connect(style).run("ship it", kit)
    assert halted.pending is not None
    saved = halted.model_dump_json()

    # When another client, built from nothing but the URL, resumes it
    restored = RunResult.model_validate_json(saved)
    assert restored.pending is not None
    answer = relay_answer(
        restored.pending.id,
        [RelayResult(id=call_id(style, "abc"), output="refused", is_error=True)],
    )
    done = await connect(style).run_with_answer(
        kit, json.loads(saved)["messages"], json.loads(saved)["pending"], answer
    )

    # Then the run finishes, both results in call order
    assert done.status == "done"
    results = tool_results(style, server.seen[1].body)
    assert [(r["id"], r["content"]) for r in results] == [
        (call_id(style, "abc"), "refused"),
        (call_id(style, "def"), "found x"),
    ]
    if style == "anthropic":
        assert results[0]["is_error"] is True
    assert [(t.name, t.output, t.is_error) for t in done.tool_calls] == [
        ("deploy", "refused", True),
        ("lookup", "found x", False),
    ]


def empty_reply(style: str) -> Reply:
    """A reply with no text and no calls: Claude sends `content: []` at times."""
    reply = text_reply("openai" if style == "openai" else "anthropic", "x")
    assert isinstance(reply.body, dict)
    if style == "openai":
        reply.body["choices"][0]["message"]["content"] = None
    else:
        reply.body["content"] = []
    return reply


@pytest.mark.parametrize("style", STYLES)
async def test_a_conversation_goes_on_after_the_model_replied_with_nothing(style, server, connect):
    # Given a conversation whose first answer was empty
    server.script += [empty_reply(style), text_reply(style, "Now with words.")]
    client = connect(style)
    kit = await toolkit()
    first = await client.ask("hi", kit, id="conv")
    assert first.status == "done"
    assert first.text == ""

    # When the user asks again, the whole history goes to the provider
    second = await client.ask("say something", kit, id="conv")

    # Then the provider accepts it (Anthropic refuses empty text blocks)
    assert second.status == "done"
    assert second.text == "Now with words."
    assert len(server.seen) == 2
