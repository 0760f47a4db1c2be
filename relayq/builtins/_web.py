"""The webfetch builtin: GET one http(s) URL and return its text."""

from __future__ import annotations

import asyncio
import codecs
from typing import Any

import httpx

from relayq._tools import Tool, ToolContext
from relayq._types import ToolResult
from relayq.builtins._common import OutputSink, ToolFailure, async_builtin, opt_seconds, req_str
from relayq.builtins._config import BuiltinsConfig

__all__ = ["webfetch_tool"]

# Content types that are text even though they do not start with text/.
_TEXTUAL = ("json", "xml", "javascript", "ecmascript", "yaml", "toml", "csv", "x-www-form")


def webfetch_tool(config: BuiltinsConfig) -> Tool:
    limit = config.webfetch_timeout.total_seconds()
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "An http:// or https:// URL to GET."},
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "description": f"Give up after this many seconds. Default and maximum: {limit:g}.",
            },
        },
        "required": ["url"],
        "additionalProperties": False,
    }

    async def webfetch(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        url = _http_url(req_str(args, "url"))
        timeout = opt_seconds(args, "timeout_seconds", limit)
        try:
            # The client's timeout bounds each read; this one bounds the whole fetch,
            # so a server trickling bytes cannot hold the call forever.
            async with asyncio.timeout(timeout):
                return await _fetch(url, timeout, config.max_output_chars)
        except (TimeoutError, httpx.TimeoutException):
            return ToolResult.error(f"timed out after {timeout:g} s fetching {url}")
        except httpx.HTTPError as exc:
            return ToolResult.error(f"could not fetch {url}: {type(exc).__name__}: {exc}")

    return async_builtin(
        "webfetch",
        "Fetch a web page or file over http or https with GET, following redirects, and "
        "return its body as text. A status other than 2xx is an error carrying the code.",
        schema,
        webfetch,
    )


def _http_url(raw: str) -> httpx.URL:
    try:
        url = httpx.URL(raw)
    except httpx.InvalidURL as exc:
        raise ToolFailure(f"invalid URL {raw!r}: {exc}") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise ToolFailure(f"only http:// and https:// URLs can be fetched, not {raw!r}")
    return url


async def _fetch(url: httpx.URL, seconds: float, max_chars: int) -> ToolResult:
    async with (
        httpx.AsyncClient(follow_redirects=True, timeout=seconds) as client,
        client.stream("GET", url) as response,
    ):
        kind = response.headers.get("content-type", "")
        if response.is_success and not _is_text(kind):
            return ToolResult.error(f"{response.url} is {kind}, not text; it cannot be shown")
        sink = OutputSink(max_chars, _codec(response.charset_encoding))
        async for chunk in response.aiter_bytes():
            sink.feed(chunk)
        body = sink.text()
        if not response.is_success:
            reason = response.reason_phrase
            return ToolResult.error(
                f"HTTP {response.status_code} {reason} from {response.url}\n{body}"
            )
        return ToolResult(output=body)


def _is_text(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "" or kind.startswith("text/") or any(t in kind for t in _TEXTUAL)


def _codec(name: str | None) -> str:
    if name:
        try:
            return codecs.lookup(name).name
        except LookupError:
            pass
    return "utf-8"
