"""A request body joined from messages' cached JSON is the body encoded whole, turn after turn."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from relayq import transcript as tx
from relayq.providers import openai_wire
from relayq.providers._fragments import Fragments, dumps, heap_bytes

TEXT = st.text(max_size=12)
CALL = st.builds(
    lambda i, name, args: {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    },
    st.integers(0, 99),
    st.sampled_from(["look", "work"]),
    TEXT,
)
MESSAGE = st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, TEXT),
    st.builds(lambda c: {"role": "assistant", "content": c}, st.one_of(st.none(), TEXT)),
    st.builds(
        lambda calls: {"role": "assistant", "content": None, "tool_calls": calls},
        st.lists(CALL, min_size=1, max_size=3),
    ),
    st.builds(
        lambda i, c, note: (
            {"role": "tool", "tool_call_id": f"c{i}", "content": c}
            | ({tx.NOTE: {"error": True}} if note else {})
        ),
        st.integers(0, 99),
        TEXT,
        st.booleans(),
    ),
)
SHAPE = st.fixed_dictionaries(
    {
        "system": st.one_of(st.none(), TEXT),
        "tools": st.lists(
            st.builds(lambda n: {"type": "function", "function": {"name": n}}, TEXT), max_size=2
        ),
        "tool_choice": st.sampled_from([None, "auto", "required"]),
        "max_tokens": st.one_of(st.none(), st.integers(1, 9999)),
    }
)


def whole(messages: list[dict[str, Any]], shape: dict[str, Any]) -> str:
    return dumps(openai_wire.encode(model="m", messages=messages, **shape))


@given(st.lists(st.lists(MESSAGE, max_size=6), min_size=1, max_size=5), SHAPE, st.data())
def test_a_growing_conversation_encodes_as_if_whole_at_every_turn(
    turns: list[list[dict[str, Any]]], shape: dict[str, Any], data: Any
):
    kept = openai_wire.fragments()
    transcript: list[dict[str, Any]] = []
    for new in turns:
        transcript.extend(new)
        if transcript and data.draw(st.booleans()):
            # A message replaced (a placeholder by its result) is a new message
            at = data.draw(st.integers(0, len(transcript) - 1))
            transcript[at] = data.draw(MESSAGE)
        joined = openai_wire.encode_json(kept, model="m", messages=transcript, **shape)
        assert joined == whole(transcript, shape)
        json.loads(joined)


def test_a_message_seen_before_is_not_encoded_again():
    encoded: list[dict[str, Any]] = []

    def wire(m: dict[str, Any]) -> dict[str, Any]:
        encoded.append(m)
        return m

    kept = Fragments(wire)
    transcript = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    for m in transcript:
        kept.of(m)
    transcript.append({"role": "user", "content": "again"})
    for m in transcript:
        kept.of(m)
    assert [m["content"] for m in encoded] == ["hi", "yo", "again"]
    # An equal message that is another object is encoded on its own
    kept.of(dict(transcript[0]))
    assert len(encoded) == 4


def test_past_its_limit_the_least_recently_used_go_first_and_it_stays_true():
    # Given a cache that keeps 5 entries' worth of messages alive
    one = {"role": "user", "content": "x" * 30}
    kept = Fragments(lambda m: m, limit=5 * (heap_bytes(one) + 300))
    messages = [{"role": "user", "content": "x" * 30} for _ in range(10)]
    for m in messages[:4]:
        assert kept.of(m) == dumps(m)
    # When the first is used again, then six more are encoded
    kept.of(messages[0])
    for m in messages[4:]:
        assert kept.of(m) == dumps(m)
    # Then it holds no more than its bound, the oldest used went first, and what it
    # gives is still true
    assert kept.size <= kept.limit
    assert len(kept) < 6
    assert kept.of(messages[0]) == dumps(messages[0])


def test_what_the_cache_keeps_alive_is_within_its_bound_as_measured():
    # Given a cache of 1 MiB, the only holder of the messages it encodes
    limit = 2**20
    kept = openai_wire.fragments()
    kept.limit = limit
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        # When it encodes 20,000 short messages, as most of an agent's are (a short tool
        # result and a call: the heap they hold is many times their JSON)
        for i in range(10_000):
            kept.of({"role": "tool", "tool_call_id": f"c{i}", "content": f"marked c{i}"})
            kept.of(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": f"c{i}", "type": "function",
                         "function": {"name": "look", "arguments": f'{{"q": "{i}"}}'}}
                    ],
                }
            )  # fmt: skip
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Then the heap it keeps, measured, is within its bound
    assert kept.size <= limit
    assert grown <= limit * 1.1, f"{grown / 2**20:.1f} MiB kept, bound {limit / 2**20:.0f}"


def test_a_message_too_large_for_the_bound_is_encoded_and_not_kept():
    kept = Fragments(lambda m: m, limit=1000)
    huge = {"role": "user", "content": "x" * 5000}
    assert kept.of(huge) == dumps(huge)
    assert len(kept) == 0
