"""A local model server speaking the real OpenAI chat-completions and Anthropic messages formats.

It validates requests the way the real APIs do (auth, required fields,
message order, tool results matched to tool calls) and answers malformed
ones with their error shapes. What it answers to a valid request comes from
a `respond(dialect, body)` function, or from a queue of scripted replies.
Runs uvicorn in a thread on 127.0.0.1 and a free port.

    with ProviderServer(respond) as server:
        create_client(server.openai_url, "openai", "gpt-test", api_key="sk-test")
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

Respond = Callable[[str, dict[str, Any]], "Reply | Awaitable[Reply]"]
API_KEY = "sk-test-0123456789abcdef"


@dataclass
class Reply:
    """What the server sends: a body (a dict becomes JSON), a status, headers, a delay first."""

    body: dict[str, Any] | str
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


# -- replies in each dialect ------------------------------------------------------------------


def openai_text(text: str, *, finish: str = "stop", model: str = "gpt-test") -> Reply:
    return Reply(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish,
                }
            ],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }
    )


def openai_calls(*calls: tuple[str, str, dict[str, Any]], model: str = "gpt-test") -> Reply:
    tool_calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in calls
    ]
    return Reply(
        {
            "id": "chatcmpl-2",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": tool_calls},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
        }
    )


def anthropic_text(text: str, *, stop: str = "end_turn", model: str = "claude-test") -> Reply:
    return Reply(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop,
            "usage": {"input_tokens": 13, "output_tokens": 4},
        }
    )


def anthropic_calls(*calls: tuple[str, str, dict[str, Any]], model: str = "claude-test") -> Reply:
    return Reply(
        {
            "id": "msg_2",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in calls],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 30, "output_tokens": 9},
        }
    )


def error(status: int, message: str = "error", **headers: str) -> Reply:
    return Reply(
        {"error": {"type": "api_error", "message": message}}, status=status, headers=headers
    )


# -- validation, as the real APIs do it -------------------------------------------------------


class Invalid(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def check_openai(headers: dict[str, str], body: dict[str, Any], key: str = API_KEY) -> None:
    if headers.get("authorization") != f"Bearer {key}":
        raise Invalid(401, "Incorrect API key provided")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Invalid(400, "you must provide a model parameter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Invalid(400, "'messages' must be a non-empty array")
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        open_calls = _check_openai_message(i, m, open_calls)
    if open_calls:
        raise Invalid(400, f"tool calls without responses: {sorted(open_calls)}")
    for t in body.get("tools") or []:
        if t.get("type") != "function" or "name" not in (t.get("function") or {}):
            raise Invalid(400, "tools: each needs type 'function' and function.name")
    _check_openai_choice(body.get("tool_choice"))


def _check_openai_message(i: int, m: dict[str, Any], open_calls: set[str]) -> set[str]:
    """Message `i` against the calls still waiting for a result; returns those left waiting."""
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool", "developer"):
        raise Invalid(400, f"messages[{i}].role: invalid value {role!r}")
    if set(m) - {"role", "content", "tool_calls", "tool_call_id", "name"}:
        raise Invalid(
            400, f"messages[{i}]: unrecognized keys {sorted(set(m) - {'role', 'content'})}"
        )
    if role == "tool":
        if m.get("tool_call_id") not in open_calls:
            raise Invalid(
                400,
                f"messages[{i}]: messages with role 'tool' must be a response to a preceeding "
                "message with 'tool_calls'",
            )
        return open_calls - {m["tool_call_id"]}
    if open_calls:
        raise Invalid(
            400,
            "An assistant message with 'tool_calls' must be followed by tool messages "
            f"responding to each 'tool_call_id'. Missing: {sorted(open_calls)}",
        )
    if role == "assistant" and m.get("content") is None and not m.get("tool_calls"):
        # "content: Required unless tool_calls or function_call is specified."
        raise Invalid(
            400, f"messages[{i}]: Invalid value for 'content': expected a string, got null."
        )
    waiting: set[str] = set()
    for tc in m.get("tool_calls") or [] if role == "assistant" else []:
        if tc.get("type") != "function" or not isinstance(
            (tc.get("function") or {}).get("arguments"), str
        ):
            raise Invalid(
                400, f"messages[{i}].tool_calls: each needs type 'function' and string arguments"
            )
        waiting.add(tc["id"])
    return waiting


def _check_openai_choice(choice: object) -> None:
    if choice is None or choice in ("none", "auto", "required"):
        return
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance((choice.get("function") or {}).get("name"), str)
    ):
        return
    raise Invalid(
        400,
        f"Invalid value for 'tool_choice': {choice!r}; expected 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}",
    )


def check_anthropic(headers: dict[str, str], body: dict[str, Any], key: str = API_KEY) -> None:
    if headers.get("x-api-key") != key:
        raise Invalid(401, "invalid x-api-key")
    if not headers.get("anthropic-version"):
        raise Invalid(400, "anthropic-version: header is required")
    for required in ("model", "max_tokens", "messages"):
        if required not in body:
            raise Invalid(400, f"{required}: Field required")
    messages = body["messages"]
    if not messages or messages[0].get("role") != "user":
        raise Invalid(400, 'messages: first message must use the "user" role')
    uses: set[str] = set()
    for i, m in enumerate(messages):
        if m.get("role") not in ("user", "assistant"):
            raise Invalid(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if i and messages[i - 1]["role"] == m["role"]:
            raise Invalid(400, 'messages: roles must alternate between "user" and "assistant"')
        uses = _check_anthropic_turn(i, m, uses, last=i == len(messages) - 1)
    if uses:
        raise Invalid(400, "the last assistant turn's tool_use blocks have no tool_result")
    _check_anthropic_tools(body.get("tools") or [])
    _check_anthropic_choice(body.get("tool_choice"))


def _check_anthropic_turn(i: int, m: dict[str, Any], uses: set[str], *, last: bool) -> set[str]:
    """Turn `i` against the previous turn's tool_use ids; returns this turn's."""
    content = m.get("content")
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    )
    if not content and not (m["role"] == "assistant" and last):
        raise Invalid(
            400,
            f"messages.{i}: all messages must have non-empty content except for the "
            "optional final assistant message",
        )
    _check_text_blocks(blocks)
    if m["role"] == "assistant":
        return {b["id"] for b in blocks if b.get("type") == "tool_use"}
    results = [b for b in blocks if b.get("type") == "tool_result"]
    ids = [str(b.get("tool_use_id")) for b in results]
    if sorted(ids) != sorted(uses) or len(set(ids)) != len(ids):
        raise Invalid(
            400,
            f"messages.{i}: tool_use ids were found without tool_result blocks immediately "
            f"after: expected {sorted(uses)}, got {ids}",
        )
    if results and blocks[: len(results)] != results:
        raise Invalid(400, f"messages.{i}: tool_result blocks must come first")
    return set()


def _check_text_blocks(blocks: list[dict[str, Any]]) -> None:
    for b in blocks:
        if b.get("type") != "text":
            continue
        if not b.get("text"):
            raise Invalid(400, "messages: text content blocks must be non-empty")
        if not str(b["text"]).strip():
            raise Invalid(400, "messages: text content blocks must contain non-whitespace text")


def _check_anthropic_tools(tools: list[dict[str, Any]]) -> None:
    for j, t in enumerate(tools):
        if not isinstance(t.get("name"), str) or not _TOOL_NAME.match(t["name"]):
            raise Invalid(
                400, f"tools.{j}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise Invalid(400, f"tools.{j}.input_schema: Field required")
        if schema.get("type") != "object":
            raise Invalid(400, f"tools.{j}.input_schema.type: Input should be 'object'")
        extra = sorted(set(t) - {"name", "description", "input_schema", "type", "cache_control"})
        if extra:
            raise Invalid(400, f"tools.{j}.{extra[0]}: Extra inputs are not permitted")


def _check_anthropic_choice(choice: object) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict):
        choice = {}
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise Invalid(
            400,
            "tool_choice: Input tag does not match any of the expected tags: "
            "'auto', 'any', 'tool', 'none'",
        )
    if kind == "tool" and not isinstance(choice.get("name"), str):
        raise Invalid(400, "tool_choice.tool.name: Field required")


# -- the server -------------------------------------------------------------------------------


@dataclass
class Seen:
    dialect: str
    headers: dict[str, str]
    body: dict[str, Any]


class ProviderServer:
    """Serves `/v1/chat/completions` (openai) and `/v1/messages` (anthropic) on a free port."""

    def __init__(self, respond: Respond | None = None, *, api_key: str = API_KEY) -> None:
        self._respond = respond
        self.api_key = api_key
        """The one key the server accepts (real keys come in many shapes, not only `sk-...`)."""
        self.script: list[Reply] = []
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak_in_flight = 0
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._openai, methods=["POST"]),
                Route("/v1/messages", self._anthropic, methods=["POST"]),
            ]
        )
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", backlog=4096
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def base(self) -> str:
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    @property
    def openai_url(self) -> str:
        return f"{self.base}/v1"

    @property
    def anthropic_url(self) -> str:
        return self.base

    def __enter__(self) -> ProviderServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("provider server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    async def _openai(self, request: Request) -> Response:
        return await self._serve(
            "openai", request, functools.partial(check_openai, key=self.api_key)
        )

    async def _anthropic(self, request: Request) -> Response:
        return await self._serve(
            "anthropic", request, functools.partial(check_anthropic, key=self.api_key)
        )

    async def _serve(
        self,
        dialect: str,
        request: Request,
        check: Callable[[dict[str, str], dict[str, Any]], None],
    ) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError:
            return _error(dialect, 400, "could not parse the JSON body")
        with self._lock:
            self.seen.append(Seen(dialect, headers, body))
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            try:
                check(headers, body)
            except Invalid as bad:
                return _error(dialect, bad.status, bad.message)
            reply = await self._reply(dialect, body)
            if reply.delay:
                await asyncio.sleep(reply.delay)
            if isinstance(reply.body, str):
                return Response(reply.body, status_code=reply.status, headers=reply.headers)
            return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def _reply(self, dialect: str, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self.script:
                return self.script.pop(0)
        if self._respond is None:
            raise RuntimeError("no scripted reply left and no respond function")
        reply = self._respond(dialect, body)
        return await reply if asyncio.iscoroutine(reply) else reply  # type: ignore[return-value]


def _error(dialect: str, status: int, message: str) -> Response:
    if dialect == "anthropic":
        kind = "authentication_error" if status == 401 else "invalid_request_error"
        return JSONResponse(
            {"type": "error", "error": {"type": kind, "message": message}}, status_code=status
        )
    return JSONResponse(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        },
        status_code=status,
    )
