"""`translate`: one provider call from OpenAI-shaped messages, answered in one shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from relayq import Usage
from relayq.providers import TranslatedCall
from tests.provider_server import Reply, anthropic_calls, anthropic_text, openai_calls, openai_text

from .wire import STYLES, call_id, calls_reply, text_reply, toolkit

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Oslo and Rome?"},
    {
        "role": "assistant",
        "content": "Checking both.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Rome"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    {"role": "tool", "tool_call_id": "call_2", "content": "sun"},
    {"role": "assistant", "content": "Oslo: rain. Rome: sun."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize("style", STYLES)
async def test_translate_makes_one_request_and_runs_no_tool_even_when_the_model_calls_one(
    style, server, connect
):
    counts: dict[str, int] = {}
    kit = await toolkit(counts)
    server.script += [
        calls_reply(style, ("a", "lookup", {"q": "tides"})),
        text_reply(style, "never asked"),
    ]

    result = await connect(style).translate(
        [{"role": "user", "content": "tides?"}], tools=[WEATHER], toolkit=kit
    )

    assert len(server.seen) == 1
    assert counts == {}, "a tool the model called was not run"
    assert result.finish_reason == "tool_calls"
    assert result.tool_calls == [
        TranslatedCall(id=call_id(style, "a"), name="lookup", arguments='{"q": "tides"}')
    ]
    declared = server.seen[0].body["tools"]
    names = [t["function"]["name"] if style == "openai" else t["name"] for t in declared]
    assert names == ["weather", "lookup", "explode", "deploy"]


@pytest.mark.parametrize("style", STYLES)
async def test_translate_keeps_nothing_between_calls(style, server, connect):
    client = connect(style)
    server.script += [text_reply(style, "one"), text_reply(style, "two")]

    await client.translate([{"role": "user", "content": "first"}])
    await client.translate([{"role": "user", "content": "second"}])

    second = server.seen[1].body["messages"]
    assert len(second) == 1
    assert "first" not in json.dumps(second)


@pytest.mark.parametrize("style", STYLES)
async def test_a_multi_turn_history_with_tool_calls_is_accepted_in_either_dialect(
    style, server, connect
):
    server.script.append(text_reply(style, "Cloudy."))

    result = await connect(style).translate(HISTORY, tools=[WEATHER])

    assert result.text == "Cloudy."
    assert result.finish_reason == "stop"
    assert len(server.seen) == 1, "the server accepted the history at the first try"


async def test_an_openai_history_reaches_openai_as_it_was_given(server, connect):
    server.script.append(text_reply("openai", "Cloudy."))

    await connect("openai").translate(HISTORY, tools=[WEATHER], system="Answer in English.")

    sent = server.seen[0].body
    assert sent["messages"] == [{"role": "system", "content": "Answer in English."}, *HISTORY]
    assert sent["tools"] == [WEATHER]


async def test_an_openai_history_becomes_alternating_anthropic_turns_with_merged_tool_results(
    server, connect
):
    server.script.append(text_reply("anthropic", "Cloudy."))

    await connect("anthropic").translate(HISTORY, tools=[WEATHER], system="Answer in English.")

    sent = server.seen[0].body
    assert sent["system"] == "Answer in English.\n\nYou are terse."
    assert sent["tools"] == [
        {
            "name": "weather",
            "description": "The weather in a city.",
            "input_schema": WEATHER["function"]["parameters"],
        }
    ]
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo and Rome?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "call_2", "name": "weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "sun"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Oslo: rain. Rome: sun."}]},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
    ]


async def test_a_user_message_after_tool_results_joins_their_anthropic_turn_after_them(
    server, connect
):
    history = [*HISTORY[:5], {"role": "user", "content": "Also Paris?"}]
    server.script.append(text_reply("anthropic", "ok"))

    await connect("anthropic").translate(history, tools=[WEATHER])

    last = server.seen[0].body["messages"][-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "tool_result", "text"]
    assert last["content"][-1]["text"] == "Also Paris?"


async def test_openai_text_content_parts_reach_anthropic_as_their_text(server, connect):
    # OpenAI chat messages may carry content as a list of parts.
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
        {"role": "assistant", "content": None, "tool_calls": HISTORY[2]["tool_calls"][:1]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "rain"}]},
    ]
    server.script.append(text_reply("anthropic", "Rain."))

    await connect("anthropic").translate(history, tools=[WEATHER])

    sent = server.seen[0].body["messages"]
    assert sent[0]["content"] == [{"type": "text", "text": "Weather in Oslo?"}]
    result = sent[2]["content"][0]
    assert result["tool_use_id"] == "call_1"
    assert result["content"] in ("rain", [{"type": "text", "text": "rain"}])


@pytest.mark.parametrize("style", STYLES)
async def test_parallel_calls_all_come_back_with_arguments_as_json_strings(style, server, connect):
    server.script.append(
        calls_reply(
            style,
            ("a", "weather", {"city": "Oslo"}),
            ("b", "weather", {"city": "Rome", "days": 2}),
            ("c", "weather", {}),
        )
    )

    result = await connect(style).translate(
        [{"role": "user", "content": "Oslo, Rome, here?"}], tools=[WEATHER]
    )

    assert [c.id for c in result.tool_calls] == [call_id(style, s) for s in "abc"]
    assert all(isinstance(c.arguments, str) for c in result.tool_calls)
    assert [json.loads(c.arguments) for c in result.tool_calls] == [
        {"city": "Oslo"},
        {"city": "Rome", "days": 2},
        {},
    ]
    assert result.finish_reason == "tool_calls"


NAMED = {"type": "function", "function": {"name": "weather"}}


@pytest.mark.parametrize(
    ("choice", "openai", "anthropic"),
    [
        ("auto", "auto", {"type": "auto"}),
        ("required", "required", {"type": "any"}),
        ("none", "none", {"type": "none"}),
        (NAMED, NAMED, {"type": "tool", "name": "weather"}),
        ({"name": "weather"}, NAMED, {"type": "tool", "name": "weather"}),
    ],
)
@pytest.mark.parametrize("style", STYLES)
async def test_tool_choice_is_spelled_the_way_each_dialect_wants(
    style, choice, openai, anthropic, server, connect
):
    server.script.append(text_reply(style, "ok"))

    await connect(style).translate(
        [{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice=choice
    )

    assert server.seen[0].body["tool_choice"] == (openai if style == "openai" else anthropic)


@pytest.mark.parametrize("style", STYLES)
async def test_no_tool_choice_sends_none_and_max_tokens_is_passed_on(style, server, connect):
    server.script.append(text_reply(style, "ok"))

    await connect(style).translate([{"role": "user", "content": "hi"}], max_tokens=99)

    body = server.seen[0].body
    assert "tool_choice" not in body
    assert "tools" not in body
    assert body["max_tokens"] == 99


def with_calls_but_finish(style: str, reason: str) -> Reply:
    """A reply with a call whose finish reason does not say so (some providers do this)."""
    if style == "openai":
        reply = openai_calls(("call_x", "weather", {"city": "Oslo"}))
        assert isinstance(reply.body, dict)
        reply.body["choices"][0]["finish_reason"] = reason
    else:
        reply = anthropic_calls(("toolu_x", "weather", {"city": "Oslo"}))
        assert isinstance(reply.body, dict)
        reply.body["stop_reason"] = reason
    return reply


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (openai_text("a", finish="stop"), "stop"),
        (openai_text("a", finish="length"), "length"),
        (openai_text("a", finish="content_filter"), "content_filter"),
        (openai_calls(("call_x", "weather", {})), "tool_calls"),
        (with_calls_but_finish("openai", "stop"), "tool_calls"),
        (anthropic_text("a", stop="end_turn"), "stop"),
        (anthropic_text("a", stop="stop_sequence"), "stop"),
        (anthropic_text("a", stop="max_tokens"), "length"),
        (anthropic_text("a", stop="refusal"), "content_filter"),
        (anthropic_calls(("toolu_x", "weather", {})), "tool_calls"),
        (with_calls_but_finish("anthropic", "end_turn"), "tool_calls"),
    ],
)
async def test_finish_reasons_map_to_one_vocabulary(reply, expected, server, connect):
    style = "openai" if "choices" in reply.body else "anthropic"
    server.script.append(reply)

    result = await connect(style).translate([{"role": "user", "content": "hi"}], tools=[WEATHER])

    assert result.finish_reason == expected


@pytest.mark.parametrize(
    ("style", "usage", "model"),
    [
        ("openai", Usage(prompt_tokens=11, completion_tokens=7, total_tokens=18), "gpt-4o-x"),
        ("anthropic", Usage(prompt_tokens=13, completion_tokens=4, total_tokens=17), "claude-x"),
    ],
)
async def test_usage_and_the_answering_model_are_filled_in(style, usage, model, server, connect):
    reply = (
        openai_text("hi", model=model) if style == "openai" else anthropic_text("hi", model=model)
    )
    server.script.append(reply)

    result = await connect(style).translate([{"role": "user", "content": "hi"}])

    assert result.text == "hi"
    assert result.usage == usage
    assert result.model == model
    assert result.tool_calls == []
