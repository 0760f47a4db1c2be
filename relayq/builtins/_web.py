"""The webfetch builtin: GET one http(s) URL and return its text.

Only public addresses are reached unless the agent's config allows more: each
host is resolved here, every address judged (`_netguard`), and the request sent
to the very address judged, the name going in the Host header and in TLS (SNI
and certificate check). Redirects are followed here, one hop at a time, each
judged the same way, so neither a redirect nor a DNS answer that changes
between check and connect (rebinding) reaches a private service.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import ssl
from typing import Any

import httpx

from relayq._tools import Tool, ToolContext
from relayq._types import ToolResult
from relayq.builtins._common import OutputSink, ToolFailure, async_builtin, opt_seconds, req_str
from relayq.builtins._config import BuiltinsConfig
from relayq.builtins._netguard import NetGuard

__all__ = ["webfetch_tool"]

# Content types that are text even though they do not start with text/.
_TEXTUAL = ("json", "xml", "javascript", "ecmascript", "yaml", "toml", "csv", "x-www-form")
_MAX_REDIRECTS = 10


def webfetch_tool(config: BuiltinsConfig) -> Tool:
    limit = config.webfetch_timeout.total_seconds()
    guard = NetGuard(config.webfetch_allowed_networks)
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
                return await _fetch(url, guard, timeout, config.max_output_chars)
        except (TimeoutError, httpx.TimeoutException):
            return ToolResult.error(f"timed out after {timeout:g} s fetching {url}")
        except httpx.HTTPError as exc:
            return ToolResult.error(f"could not fetch {url}: {type(exc).__name__}: {exc}")

    return async_builtin(
        "webfetch",
        "Fetch a web page or file over http or https with GET, following redirects, and "
        "return its body as text. A status other than 2xx is an error carrying the code. "
        "Only public internet addresses can be reached.",
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


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context (httpx's own, with certifi's CAs) for every fetch of the process:
    httpx would make one a client, reading the CA bundle each time (tens of ms of a core)."""
    return httpx.create_ssl_context(trust_env=False)


async def _fetch(url: httpx.URL, guard: NetGuard, seconds: float, max_chars: int) -> ToolResult:
    # trust_env=False: a proxy from the environment would connect on our behalf,
    # to an address nobody judged.
    async with httpx.AsyncClient(
        follow_redirects=False, timeout=seconds, trust_env=False, verify=_tls()
    ) as client:
        for _ in range(_MAX_REDIRECTS + 1):
            address = await guard.address_for(url)
            async with client.stream("GET", **_pinned(url, address)) as response:
                location = response.headers.get("location")
                if response.is_redirect and location:
                    url = _next_hop(url, location)
                    continue
                return await _result(url, response, max_chars)
    return ToolResult.error(f"more than {_MAX_REDIRECTS} redirects fetching {url}; gave up")


def _pinned(url: httpx.URL, address: str) -> dict[str, Any]:
    """Request arguments that connect to `address` while speaking to `url`'s host."""
    extensions: dict[str, Any] = {}
    if url.scheme == "https":
        extensions["sni_hostname"] = url.raw_host.decode("ascii")
    return {
        "url": url.copy_with(host=address),
        "headers": {"Host": url.netloc.decode("ascii")},
        "extensions": extensions,
    }


def _next_hop(url: httpx.URL, location: str) -> httpx.URL:
    try:
        target = url.join(location)
    except httpx.InvalidURL as exc:
        raise ToolFailure(f"{url} redirected to an invalid URL {location!r}: {exc}") from exc
    if target.scheme not in ("http", "https") or not target.host:
        raise ToolFailure(f"{url} redirected to {location!r}, which is not http(s); not followed")
    return target


async def _result(url: httpx.URL, response: httpx.Response, max_chars: int) -> ToolResult:
    kind = response.headers.get("content-type", "")
    if response.is_success and not _is_text(kind):
        return ToolResult.error(f"{url} is {kind}, not text; it cannot be shown")
    sink = OutputSink(max_chars, _codec(response.charset_encoding))
    async for chunk in response.aiter_bytes():
        sink.feed(chunk)
    body = sink.text()
    if not response.is_success:
        reason = response.reason_phrase
        return ToolResult.error(f"HTTP {response.status_code} {reason} from {url}\n{body}")
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
