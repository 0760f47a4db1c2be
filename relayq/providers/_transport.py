"""`ProviderModel`: a model over HTTP, with retries, and keys that never leak.

A key is read when a call is made and goes only into that request's headers.
Error messages carry the status and at most 500 characters of the body, with
the key (and anything shaped like a bearer token or an `sk-` key) redacted.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import ssl
import time
import weakref
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpx

from relayq._errors import ModelError
from relayq._model import InProcessRequest, InProcessResponse
from relayq._retry import backoff
from relayq.providers import _anthropic, _openai
from relayq.providers._config import ProviderConfig
from relayq.providers._wire import Reply, ToolChoice

__all__ = ["RETRYABLE_STATUS", "ProviderModel", "redact"]

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504, 529})
_BODY_CAP = 500
# Connections per httpx pool: a pool scans all its connections at every
# request: with 500 in flight a call cost 1.9 ms of CPU in shards of 32
# and 1.0 ms in shards of 8.
_SHARD_SIZE = 8
_SECRETS = re.compile(r"(?i)(bearer\s+)[^\s\"']+|\bsk-[A-Za-z0-9_\-]{6,}")


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every given secret, bearer token and `sk-...` key replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return _SECRETS.sub(lambda m: (m.group(1) or "") + "[redacted]", text)


def _retry_after(headers: httpx.Headers) -> float | None:
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


class ProviderModel:
    """An async model (`InProcessRequest -> InProcessResponse`) served by an HTTP endpoint."""

    def __init__(
        self, config: ProviderConfig, *, api_key: str | None = None, retries: int | None = None
    ) -> None:
        self.config = config
        self.retries = config.retries if retries is None else retries
        self._api_key = api_key
        self._dialect = _anthropic if config.style == "anthropic" else _openai
        self._url = self._dialect.path(config.base_url)
        # Connection pools per event loop (a pool cannot cross loops), several
        # of them: httpx scans its whole pool on every request, which costs more
        # than the request itself once hundreds of connections are open.
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, list[httpx.AsyncClient]
        ] = weakref.WeakKeyDictionary()
        self._turn = 0

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
        body = self._dialect.encode(
            model=self.config.model,
            messages=messages,
            tools=tools or [],
            system=system,
            tool_choice=tool_choice,
            max_tokens=max_tokens or self.config.max_tokens,
        )
        attempt = 0
        while True:
            try:
                return await self._post(body)
            except ModelError as exc:
                if not exc.retryable or attempt >= self.retries:
                    raise
                await asyncio.sleep(backoff(attempt, exc.retry_after))
                attempt += 1

    async def _post(self, body: dict[str, Any]) -> Reply:
        key = self.config.resolve_key(self._api_key)
        headers = {**self.config.headers, **self._dialect.headers(key)}
        where = f"{self.config.style} endpoint {urlsplit(self._url).netloc}"
        try:
            response = await self._client().post(
                self._url, json=body, headers=headers, timeout=self.config.timeout
            )
        except httpx.TimeoutException:
            raise ModelError(
                f"{where} timed out after {self.config.timeout:g} s", retryable=True
            ) from None
        except httpx.TransportError as exc:
            raise ModelError(
                f"{where} unreachable: {redact(str(exc), key)}", retryable=True
            ) from None
        if response.status_code >= 400:
            raise self._error(response, where, key)
        try:
            reply: Reply = self._dialect.decode(response.json())
            return reply
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(f"{where} sent an unreadable response: {exc}") from None

    def _error(self, response: httpx.Response, where: str, key: str) -> ModelError:
        status = response.status_code
        # Redact before cutting: a key cut in half would no longer match.
        text = redact(response.text, key)[:_BODY_CAP]
        retryable = status in RETRYABLE_STATUS
        return ModelError(
            f"{where} answered {status}: {text}",
            retryable=retryable,
            retry_after=_retry_after(response.headers) if retryable else None,
            status=status,
        )

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        shards = self._clients.get(loop)
        if shards is None or shards[0].is_closed:
            count = max(1, -(-self.config.max_connections // _SHARD_SIZE))
            per_shard = -(-self.config.max_connections // count)
            limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
            tls = ssl.create_default_context(cafile=certifi.where())  # loaded once, shared
            shards = [
                httpx.AsyncClient(limits=limits, timeout=self.config.timeout, verify=tls)
                for _ in range(count)
            ]
            self._clients[loop] = shards
        self._turn = (self._turn + 1) % len(shards)
        return shards[self._turn]

    async def aclose(self) -> None:
        """Close this loop's connection pools."""
        for client in self._clients.pop(asyncio.get_running_loop(), []):
            await client.aclose()
