"""`ProviderModel`: a model over HTTP, with retries, and keys that never leak.

A key is read when a call is made and goes only into that request's headers.
A provider's error becomes a ModelError holding its status, its type and a
short message (300 characters at most), never its body as such: a 400 may
echo the request, prompts and all. Whatever the message quotes of the
request's messages is replaced by `[request text]`, and the key, bearer
tokens, `sk-` keys and long random-looking tokens by `[redacted]`.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from relayq._errors import ModelError
from relayq.limits import ERROR_TEXT_LIMIT, redact_secrets, safe_text, without_echoes
from relayq.model import InProcessRequest, InProcessResponse
from relayq.providers import anthropic_wire, openai_wire
from relayq.providers._config import ProviderConfig
from relayq.providers._fragments import dumps
from relayq.providers._wire import Reply, ToolChoice
from relayq.retry import backoff

if TYPE_CHECKING:
    from relayq.providers._http import Answer

__all__ = ["RETRYABLE_STATUS", "ProviderModel", "redact"]

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504, 529})
# Of an error's message, only this much is read for echoes of the request;
# less than that is kept.
_READ_CAP = 4 * ERROR_TEXT_LIMIT


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every given secret, bearer token, `sk-...` key and long random token replaced."""
    return redact_secrets(text, *secrets)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    if "retry-after-ms" in headers:
        try:
            return float(headers["retry-after-ms"]) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error(response: Answer, where: str, key: str, request: dict[str, Any]) -> ModelError:
    """The provider's status, error type and message, safe to store and to log."""
    status = response.status
    kind, message = _error_of(response)
    # Echoes out and keys redacted before cutting: a key cut in half would no longer match.
    text = safe_text(redact(without_echoes(message[:_READ_CAP], _texts_of(request)), key))
    kind = safe_text(redact(kind, key), limit=60) if kind else ""
    retryable = status in RETRYABLE_STATUS
    return ModelError(
        f"{where} answered {status}"
        + (f" ({kind})" if kind else "")
        + (f": {text}" if text else ""),
        retryable=retryable,
        retry_after=_retry_after(response.headers) if retryable else None,
        status=status,
    )


def _error_of(response: Answer) -> tuple[str, str]:
    """The error's type and message from an OpenAI- or Anthropic-shaped body; of any other
    body, its text as the message. Every other field (a `param`, an echoed request) is left."""
    try:
        body = json.loads(response.body)
    except ValueError:
        return "", response.text()
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, str):
        return "", error
    if not isinstance(error, dict):
        error = body if isinstance(body, dict) and "message" in body else {}
    kind = error.get("type") or error.get("code") or ""
    message = error.get("message") or (body.get("detail") if isinstance(body, dict) else None)
    return str(kind), message if isinstance(message, str) else ""


_STRUCTURAL = frozenset({"role", "type", "id", "tool_call_id", "tool_use_id", "name"})
"""Keys of a message whose values say how it is built, not what it says."""


def _texts_of(request: dict[str, Any]) -> list[str]:
    """Every text the request's messages (and system prompt) carried."""
    found: list[str] = []
    stack: list[tuple[str, Any]] = [("messages", request.get("messages"))]
    stack.append(("system", request.get("system")))
    while stack:
        key, item = stack.pop()
        if isinstance(item, str) and key not in _STRUCTURAL:
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.items())
        elif isinstance(item, list):
            stack.extend((key, i) for i in item)
    return found


class ProviderModel:
    """An async model (`InProcessRequest -> InProcessResponse`) served by an HTTP endpoint."""

    def __init__(
        self, config: ProviderConfig, *, api_key: str | None = None, retries: int | None = None
    ) -> None:
        self.config = config
        self.retries = config.retries if retries is None else retries
        self._api_key = api_key
        self._dialect = anthropic_wire if config.style == "anthropic" else openai_wire
        self._url = self._dialect.path(config.base_url)
        self._where = f"{config.style} endpoint {urlsplit(self._url).netloc}"
        # aiohttp is imported by the first model built, not by every process that merely
        # names an agent (the API, the CLI): it is a quarter of a second of their start.
        from relayq.providers._http import UNREACHABLE, Sessions

        self._unreachable = UNREACHABLE
        self._sessions = Sessions(
            self._url, max_connections=config.max_connections, timeout=config.timeout
        )
        # The JSON of messages sent before, so a turn encodes only its new ones.
        self._fragments = openai_wire.fragments() if self._dialect is openai_wire else None

    def __repr__(self) -> str:
        return (
            f"ProviderModel({self.config.style}, {self.config.base_url!r}, {self.config.model!r})"
        )

    def without_retries(self) -> ProviderModel:
        """The same model, failing at once on a retryable error (durable workers retry as tasks)."""
        return ProviderModel(self.config, api_key=self._api_key, retries=0)

    async def __call__(self, request: InProcessRequest) -> InProcessResponse:
        reply = await self.complete(request.transcript or request.messages, tools=request.tools)
        return reply.response

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        system: str | None = None,
        tool_choice: ToolChoice = None,
        max_tokens: int | None = None,
    ) -> Reply:
        """One model call, retried on 429/5xx/timeouts up to `retries` times."""
        shape: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "tools": tools or [],
            "system": system,
            "tool_choice": tool_choice,
            "max_tokens": max_tokens or self.config.max_tokens,
        }
        if self._fragments is not None:
            data = openai_wire.encode_json(self._fragments, **shape)
        else:
            data = dumps(self._dialect.encode(**shape))
        attempt = 0
        while True:
            try:
                return await self._post(data, {"messages": messages, "system": system})
            except ModelError as exc:
                if not exc.retryable or attempt >= self.retries:
                    raise
                await asyncio.sleep(backoff(attempt, exc.retry_after))
                attempt += 1

    async def _post(self, data: str, request: dict[str, Any]) -> Reply:
        """Send the body `data`; `request` holds the texts it carries, which an error's
        message must not echo."""
        key = self.config.resolve_key(self._api_key)
        headers = {**self.config.headers, **self._dialect.headers(key)}
        where = self._where
        try:
            response = await self._sessions.post(data.encode(), headers)
        except TimeoutError:  # first: a timeout is one of UNREACHABLE's kinds too
            raise ModelError(
                f"{where} timed out after {self.config.timeout:g} s",
                retryable=True,
                unanswered="timeout",
            ) from None
        except self._unreachable as exc:
            raise ModelError(
                f"{where} unreachable: {safe_text(redact(str(exc), key))}",
                retryable=True,
                unanswered="unreachable",
            ) from None
        if response.status >= 400:
            raise _error(response, where, key, request)
        try:
            reply: Reply = self._dialect.decode(json.loads(response.body))
            return reply
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            text = safe_text(redact(str(exc), key))
            raise ModelError(f"{where} sent an unreadable response: {text}") from None

    async def aclose(self) -> None:
        """Close this loop's connections."""
        await self._sessions.aclose()
