"""The transcript: OpenAI chat-shaped messages, plus relayq's own notes.

A message may carry a `relayq` key holding what the chat shape has no room
for: a tool result's error flag, a placeholder's pending request (and, once
answered, the answer), the run id, a turn's token usage. `for_model` strips
these notes before a model sees the transcript.

Everything about a run's progress is derived from the transcript itself:
which calls still need running, which wait on the host, how many turns were
taken. There is no second copy of the state to fall out of step.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from relayq._errors import ResumeError
from relayq._types import Answer, Request, ToolCallRecord, ToolResult, Usage

NOTE = "relayq"

SlotState = Literal["todo", "done", "pending", "answered"]


@dataclass(frozen=True, kw_only=True)
class Call:
    """One tool call of an assistant message."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class Slot:
    """A call of the open turn and where it stands.

    todo: no result yet (the model's reply was saved, tools not yet run);
    done: has its result; pending: waits on `request`; answered: `answer`
    arrived for a non-relay suspension and the tool must be called again.
    """

    call: Call
    state: SlotState
    at: int
    """Where the assistant message that made the call sits in the transcript."""
    index: int | None
    """Where the call's tool message sits in the transcript, if it has one."""
    request: Request | None = None
    answer: Answer | None = None


def valid_text(text: str) -> str:
    """`text` as valid Unicode: a lone surrogate (a tool's or a provider's bad decode)
    becomes U+FFFD, since no store, wire or model can take it."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


_SURROGATE = re.compile("[\ud800-\udfff]")


def user_message(text: str, run_id: str) -> dict[str, Any]:
    return {"role": "user", "content": text, NOTE: {"run_id": run_id}}


def assistant_message(content: str, calls: list[Call], usage: Usage | None) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": valid_text(content) or None}
    if calls:
        msg["tool_calls"] = [
            {
                "id": valid_text(c.id),
                "type": "function",
                "function": {"name": valid_text(c.name), "arguments": valid_text(c.arguments)},
            }
            for c in calls
        ]
    if usage is not None:
        msg[NOTE] = {"usage": usage.model_dump(mode="json")}
    return msg


def tool_message(call_id: str, result: ToolResult) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": call_id,
        "content": valid_text(result.output),
    }
    if result.is_error:
        msg[NOTE] = {"is_error": True}
    return msg


def placeholder(call_id: str, request: Request) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": f"[waiting for the host to answer request {request.id}]",
        NOTE: {"pending": request.model_dump(mode="json")},
    }


def answered_placeholder(message: dict[str, Any], answer: Answer) -> dict[str, Any]:
    note = dict(message[NOTE])
    note["answer"] = answer.model_dump(mode="json")
    return {**message, NOTE: note}


def for_model(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transcript as a model sees it: chat shape, without relayq's notes.

    A message with no note is itself, not a copy: the models only read them
    (`InProcessRequest`), and a long conversation is not copied at every turn.
    """
    return [m if NOTE not in m else {k: v for k, v in m.items() if k != NOTE} for m in messages]


def check(messages: list[dict[str, Any]]) -> None:
    """Refuse a transcript that is not a list of chat messages."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise ResumeError(f"transcript message {i} is not a chat message with a known role")


def survey(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """`check`, `run_start` and `turns_taken` in one pass: where the run began (-1 if no
    user message) and the model's replies since; ResumeError for a message that is not
    a chat message with a known role."""
    start, turns = -1, 0
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "assistant":
            turns += 1
        elif role == "user":
            start, turns = i, 0
        elif role not in ("system", "tool"):
            raise ResumeError(f"transcript message {i} is not a chat message with a known role")
    return start, turns


def run_start(messages: list[dict[str, Any]]) -> int:
    """Index of the last user message: where the current run began (-1 if none)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return -1


def run_id_of(messages: list[dict[str, Any]]) -> str | None:
    start = run_start(messages)
    if start < 0:
        return None
    note = messages[start].get(NOTE) or {}
    run_id = note.get("run_id")
    return run_id if isinstance(run_id, str) else None


def calls_of(message: dict[str, Any]) -> list[Call]:
    out = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function") or {}
        args = fn.get("arguments", "{}")
        out.append(
            Call(
                id=str(tc.get("id", "")),
                name=str(fn.get("name", "")),
                arguments=args if isinstance(args, str) else json.dumps(args),
            )
        )
    return out


def open_turn(messages: list[dict[str, Any]]) -> int | None:
    """Index of the last assistant message if it made tool calls, else None."""
    for i in range(len(messages) - 1, -1, -1):
        role = messages[i].get("role")
        if role == "assistant":
            return i if messages[i].get("tool_calls") else None
        if role != "tool":
            return None
    return None


def slots(messages: list[dict[str, Any]]) -> list[Slot]:
    """The calls of the open turn, in call order, each with its state."""
    turn = open_turn(messages)
    if turn is None:
        return []
    where = {m.get("tool_call_id"): turn + 1 + k for k, m in enumerate(messages[turn + 1 :])}
    out = []
    for call in calls_of(messages[turn]):
        index = where.get(call.id)
        if index is None:
            out.append(Slot(call=call, state="todo", at=turn, index=None))
            continue
        note = messages[index].get(NOTE) or {}
        if "pending" not in note:
            out.append(Slot(call=call, state="done", at=turn, index=index))
            continue
        request = Request.model_validate(note["pending"])
        answer = Answer.model_validate(note["answer"]) if "answer" in note else None
        state: SlotState = "answered" if answer is not None else "pending"
        out.append(
            Slot(call=call, state=state, at=turn, index=index, request=request, answer=answer)
        )
    return out


def open_requests(messages: list[dict[str, Any]]) -> list[Request]:
    """Requests still waiting for an answer, in the order their first call was made."""
    seen: dict[str, Request] = {}
    for slot in slots(messages):
        if slot.state == "pending" and slot.request is not None:
            seen.setdefault(slot.request.id, slot.request)
    return list(seen.values())


def turns_taken(messages: list[dict[str, Any]]) -> int:
    start = run_start(messages)
    return sum(1 for m in messages[start + 1 :] if m.get("role") == "assistant")


def usage_in(message: dict[str, Any]) -> Usage:
    """What the model call that made `message` spent (nothing for other messages)."""
    note = message.get(NOTE) or {}
    if message.get("role") == "assistant" and "usage" in note:
        return Usage.model_validate(note["usage"])
    return Usage()


def usage_of(messages: list[dict[str, Any]]) -> Usage:
    total = Usage()
    for m in messages[run_start(messages) + 1 :]:
        note = m.get(NOTE) or {}
        if m.get("role") == "assistant" and "usage" in note:
            total = total + Usage.model_validate(note["usage"])
    return total


def records_of(messages: list[dict[str, Any]]) -> list[ToolCallRecord]:
    """Every resolved tool call since the run's prompt, in call order.

    Results pair with the assistant message they follow: providers may reuse a
    call id in a later turn.
    """
    out = []
    tail = messages[run_start(messages) + 1 :]
    for i, m in enumerate(tail):
        if m.get("role") != "assistant":
            continue
        results: dict[str, dict[str, Any]] = {}
        for r in tail[i + 1 :]:
            if r.get("role") != "tool":
                break
            if "pending" not in (r.get(NOTE) or {}):
                results[str(r.get("tool_call_id"))] = r
        for call in calls_of(m):
            res = results.get(call.id)
            if res is not None:
                out.append(
                    ToolCallRecord(
                        id=call.id,
                        name=call.name,
                        arguments=call.arguments,
                        output=str(res.get("content") or ""),
                        is_error=bool((res.get(NOTE) or {}).get("is_error")),
                    )
                )
    return out


def final_text(messages: list[dict[str, Any]]) -> str | None:
    """The model's final reply, if the transcript ends on one."""
    if messages and messages[-1].get("role") == "assistant" and not messages[-1].get("tool_calls"):
        return str(messages[-1].get("content") or "")
    return None
