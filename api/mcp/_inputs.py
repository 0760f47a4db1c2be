"""A run as an MCP task, and the client's input responses as relayq answers.

Pure mapping, no I/O: a run's status and open request become the task the tasks
extension describes (`working`, `input_required` with one input request per relay call
keyed by its call id, `completed`, `failed`, `cancelled`); an input response becomes a
relay result or an approval decision. Input requests are form elicitations, whose schema
holds top-level fields only: a call's result is `{output, isError}`; a decision (a tool's
approval, a budget's) is `{decision, arguments, reason}`, its edited arguments a JSON
text; any other request (a tool's `pending(...)` question) takes `{answer}`, a JSON object
as the answer's data, or a text as its output. The call's tool name, arguments and schema
ride beside them, in the result's `_meta` under `relayq/calls`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from relayq import Answer, Request
from relayq.approvals import arguments_of, is_approval, policy_of
from relayq.relay import (
    RelayResult,
    is_relay_request,
    relay_calls_of,
    relay_results_of,
)
from relayq.replies import Data, Decided, Declined, Results, answer_to
from store import StoredRequest

__all__ = ["CALLS_META", "TASKS", "Questions", "answer_of", "input_requests", "task_of"]

TASKS = "io.modelcontextprotocol/tasks"
"""The tasks extension's identifier."""

CALLS_META = "relayq/calls"

_RESULT_SCHEMA = {
    "type": "object",
    "properties": {
        "output": {"type": "string", "description": "What the call returned"},
        "isError": {"type": "boolean", "description": "Whether the call failed"},
    },
    "required": ["output"],
}
_QUESTION_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "description": "A JSON object, or a text"}},
    "required": ["answer"],
}


def _decision_schema(decisions: Sequence[str]) -> dict[str, Any]:
    """A decision's form: only what the request's policy lets a person decide."""
    properties: dict[str, Any] = {"decision": {"type": "string", "enum": list(decisions)}}
    if "edit" in decisions:
        properties["arguments"] = {
            "type": "string",
            "description": "edit: the call's arguments, as JSON",
        }
    if "decline" in decisions:
        properties["reason"] = {"type": "string", "description": "decline: why"}
    return {"type": "object", "properties": properties, "required": ["decision"]}


@dataclass(frozen=True)
class Questions:
    """What an open request asks, keyed by call id (an approval, another request: by the
    request's id)."""

    requests: dict[str, Any]
    """The input requests, form elicitations as the specification has them."""
    details: dict[str, Any]
    """Under the same keys, the tool's name, arguments and schema (an approval's tool), or
    the request's kind and data: sent beside the input requests, in `_meta`, under
    `relayq/calls` (an input request of 2026-07-28 carries no `_meta` of its own)."""

    @property
    def meta(self) -> dict[str, Any]:
        return {CALLS_META: self.details}


def input_requests(stored: StoredRequest, tools: dict[str, dict[str, Any]]) -> Questions:
    """The open request's questions; a call that already has a result is asked no more.
    `tools` maps tool names to their schemas, where known."""
    request = stored.request
    if is_approval(request):
        schema = (request.data or {}).get("schema")
        arguments = arguments_of(request)
        about = {"name": stored.tool, "arguments": arguments, "schema": schema}
        # The message alone is what most clients show: the call is in it.
        message = f"{request.prompt}\n{stored.tool} with {json.dumps(arguments)}"
        schema_of = _decision_schema(policy_of(request).decisions)
        return _ask({request.id: (message, schema_of, about)})
    if not is_relay_request(request):
        about = {"kind": request.kind, "data": request.data}
        return _ask({request.id: (request.prompt, _QUESTION_SCHEMA, about)})
    answered = (
        relay_results_of(request, stored.answer, partial=True) if stored.answer is not None else {}
    )
    return _ask(
        {
            call.id: (
                f"Run {call.name} with {call.arguments}",
                _RESULT_SCHEMA,
                {"name": call.name, "arguments": call.input, "schema": tools.get(call.name)},
            )
            for call in relay_calls_of(request)
            if call.id not in answered
        }
    )


def _ask(asked: dict[str, tuple[str, dict[str, Any], dict[str, Any]]]) -> Questions:
    requests = {
        key: {
            "method": "elicitation/create",
            "params": {"mode": "form", "message": message, "requestedSchema": schema},
        }
        for key, (message, schema, _) in asked.items()
    }
    return Questions(requests, {key: about for key, (_, _, about) in asked.items()})


def answer_of(stored: StoredRequest, responses: dict[str, Any]) -> Answer | None:
    """The answer `responses` give the open request; None if they answer none of its
    questions (unknown or already answered keys are ignored, as the extension says).
    ValueError, with what is wrong, for a response that does not fit its question."""
    request = stored.request
    if not is_relay_request(request):
        response = responses.get(request.id)
        if response is None:
            return None
        content = _content(response)
        if is_approval(request):
            return _decision(request, content)
        return _reply(request, content)
    asked = input_requests(stored, {}).requests
    results = [_result(call_id, responses[call_id]) for call_id in asked if call_id in responses]
    return answer_to(request.id, Results(results)) if results else None


def _content(response: Any) -> dict[str, Any] | None:
    """An elicitation result's content if accepted; None if declined or cancelled."""
    actions = ("accept", "decline", "cancel")
    if not isinstance(response, dict) or response.get("action") not in actions:
        raise ValueError("each input response must be an elicitation result: {action, content}")
    if response["action"] != "accept":
        return None
    content = response.get("content")
    if not isinstance(content, dict):
        raise ValueError("an accepted input response must carry content")
    return content


def _result(call_id: str, response: Any) -> RelayResult:
    content = _content(response)
    if content is None:
        return RelayResult(id=call_id, output="declined by the client", is_error=True)
    output = content.get("output")
    if not isinstance(output, str):
        raise ValueError(f"the response for call {call_id} must have a text output")
    is_error = content.get("isError", False)
    if not isinstance(is_error, bool):
        raise ValueError(f"the response for call {call_id}: isError must be true or false")
    return RelayResult(id=call_id, output=output, is_error=is_error)


def _reply(request: Request, content: dict[str, Any] | None) -> Answer:
    if content is None:
        return answer_to(request.id, Declined("declined by the client"))
    text = content.get("answer")
    if not isinstance(text, str):
        raise ValueError("the answer must be a text")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        data = {"output": text}
    return answer_to(request.id, Data(data))


def _decision(request: Request, content: dict[str, Any] | None) -> Answer:
    if content is None:
        return answer_to(request.id, Declined("declined by the client"))
    kind = content.get("decision")
    if kind == "approve":
        return answer_to(request.id, Decided("approve"))
    if kind == "decline":
        return answer_to(
            request.id, Decided("decline", reason=str(content.get("reason") or "declined"))
        )
    if kind == "edit":
        try:
            arguments = json.loads(str(content.get("arguments")))
        except ValueError:
            raise ValueError("an edit's arguments must be a JSON object") from None
        if not isinstance(arguments, dict):
            raise ValueError("an edit's arguments must be a JSON object")
        return answer_to(request.id, Decided("edit", arguments))
    raise ValueError("decision must be approve, edit or decline")


def task_of(
    run_id: str,
    status: str,
    *,
    created: datetime,
    updated: datetime,
    text: str = "",
    error: str | None = None,
    asked: Questions | None = None,
    waiting: str | None = None,
) -> dict[str, Any]:
    """The task a run is, in the extension's wire shape (a dict: `ttlMs` must stay null)."""
    task: dict[str, Any] = {
        "taskId": run_id,
        "status": "working",
        "createdAt": created.isoformat(),
        "lastUpdatedAt": updated.isoformat(),
        "ttlMs": None,
        "pollIntervalMs": 500,
    }
    if status == "done":
        task["status"] = "completed"
        task["result"] = {"content": [{"type": "text", "text": text}], "isError": False}
    elif status in ("failed", "incomplete"):
        task["status"] = "failed"
        message = error or "the run stopped at its agent's max_turns"
        task["error"] = {"code": -32603, "message": message}
    elif status == "cancelled":
        task["status"] = "cancelled"
    elif status == "pending" and asked is not None and asked.requests:
        task["status"] = "input_required"
        task["inputRequests"] = asked.requests
        task["_meta"] = asked.meta
    elif status == "pending" and waiting is not None:
        task["statusMessage"] = waiting
    return task
