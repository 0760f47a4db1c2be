"""A relay host: the program that executes relay tools, leasing their calls over HTTP.

    async def run_shell(arguments: dict, call: LeasedCall) -> str:
        ...                                  # sync or async; its return is the output

    host = RelayHost("https://relayq.example.com", token, tools={"shell": run_shell})
    await host.run()                         # serves until cancelled, or until `stop()`

The host leases calls of its tools (`POST /api/relay/leases`, a long poll: no
traffic while there is nothing to do), at most `concurrency` at once, runs each
tool function, heartbeats the lease while it runs, and posts its result (an
exception becomes an error result carrying its type and message). With the API
away it tries again with backoff. `stop()` (the CLI calls it on SIGTERM) leases
no more, hands back any call it has not started, and lets the running ones end.

A lease that lapsed while its tool ran (the host was cut off longer than the
lease) is offered to another host with `attempt` + 1: a tool with side effects
acts once with `call.key` (`runId:callId:attempt`) or, across attempts, with
`call.run_id` and `call.call_id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from relayq._errors import RelayqError
from relayq.leases import LeaseAsk, LeasedCall, LeasePage, LeaseResult

__all__ = ["HostRefused", "LeasedCall", "RelayHost", "ToolFunction"]

log = logging.getLogger(__name__)

WAIT = 30.0
"""Seconds one lease request waits for a call (the API holds it open)."""
MAX_PAUSE = 10.0
"""Seconds between tries, at most, while the API is away."""
KEEPALIVE = 2.0
"""Seconds an idle connection to the API is kept for the next request."""


ToolFunction = Callable[[dict[str, Any], LeasedCall], "str | Awaitable[str]"]


class HostRefused(RelayqError):
    """The API refused this host for good (a bad token, a tool it may not serve)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(status, detail)
        self.status = status
        self.detail = detail

    def __str__(self) -> str:
        return f"the API refused this host ({self.status}): {self.detail}"


class RelayHost:
    """Leases and runs the calls of `tools` from the relayq API at `base_url`."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        tools: Mapping[str, ToolFunction],
        concurrency: int = 8,
        lease_seconds: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not tools:
            raise ValueError("a host serves at least one tool")
        if concurrency < 1:
            raise ValueError("concurrency is at least 1")
        self.tools = dict(tools)
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
            timeout=httpx.Timeout(10.0, read=WAIT + 15.0),
            # Under uvicorn's 5 s keep-alive: a connection reused just as the server
            # closes it would fail the post on it (a ReadError, and the result sent again).
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE),
            trust_env=False,
        )
        self._running: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self.served = 0
        """Calls whose result this host recorded."""

    def stop(self) -> None:
        """Lease no more; `run` returns once the running calls have ended."""
        self._stopping.set()

    async def run(self) -> None:
        """Serve until cancelled or stopped; HostRefused if the API refuses this host."""
        pause = 0.5
        try:
            while not self._stopping.is_set():
                free = self.concurrency - len(self._running)
                if free == 0:
                    await self._one_ends()
                    continue
                try:
                    leases = await self._lease(free)
                except (httpx.TransportError, _Unavailable) as exc:
                    log.warning(
                        "relay host: the API is away (%s); again in %.1f s", _why(exc), pause
                    )
                    await self._pause(pause)
                    pause = min(pause * 2, MAX_PAUSE) * random.uniform(0.8, 1.0)
                    continue
                pause = 0.5
                for lease in leases:
                    if self._stopping.is_set():
                        await self._release(lease)
                    else:
                        self._start(lease)
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)
        finally:
            for task in self._running:
                task.cancel()
            await asyncio.gather(*self._running, return_exceptions=True)
            await self._http.aclose()

    # -- leasing --------------------------------------------------------------------------

    async def _lease(self, count: int) -> list[LeasedCall]:
        # Built, not checked: what the API refuses, it says why (HostRefused).
        ask = LeaseAsk.model_construct(
            tools=sorted(self.tools), max=count, wait=WAIT, lease_seconds=self.lease_seconds
        ).model_dump(by_alias=True)
        stop = asyncio.ensure_future(self._stopping.wait())
        post = asyncio.ensure_future(self._http.post("/api/relay/leases", json=ask))
        try:
            await asyncio.wait({stop, post}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not post.done():
            # Stopping: the wait is given up (the API stops waiting when the caller goes).
            post.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.TransportError):
                await post
            return []
        response = post.result()
        _check(response)
        return LeasePage.model_validate(response.json()).leases

    def _start(self, call: LeasedCall) -> None:
        task = asyncio.create_task(self._serve(call))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _one_ends(self) -> None:
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({stop, *self._running}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    # -- one call ---------------------------------------------------------------------------

    async def _serve(self, call: LeasedCall) -> None:
        beat = asyncio.create_task(self._heartbeat(call))
        try:
            output, is_error = await self._call(self.tools[call.name], call.arguments, call)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        await self._result(call, output, is_error)

    async def _call(
        self, function: ToolFunction, arguments: dict[str, Any], call: LeasedCall
    ) -> tuple[str, bool]:
        try:
            if inspect.iscoroutinefunction(function):
                result = await function(arguments, call)
            else:
                result = await asyncio.to_thread(function, arguments, call)
                if inspect.isawaitable(result):
                    result = await result
            # Its text too: a value whose text fails is the call's failure, not the host's.
            return str(result), False
        except Exception as exc:  # the tool's failure is the call's error result
            return f"{type(exc).__name__}: {exc}", True

    async def _heartbeat(self, call: LeasedCall) -> None:
        every = max(self.lease_seconds / 3, 0.2)
        while True:
            await asyncio.sleep(every)
            try:
                response = await self._http.post(f"/api/relay/leases/{call.lease_id}/heartbeat")
            except httpx.TransportError:
                continue  # the API is away: try again; the lease may still hold when it is back
            if response.status_code in (404, 409):
                log.warning("relay host: lease of %s lost (%s)", call.key, response.status_code)
                return

    async def _result(self, call: LeasedCall, output: str, is_error: bool) -> None:
        """Send the call's result, once taken. A result this host cannot send (text no
        UTF-8 encodes, a body the API refuses as too large, a post that fails for a
        reason of its own making) becomes an error result saying why, sent once: every
        host would fail the same way, so the call is never offered again for it."""
        body, refused = _result_body(output, is_error), False
        pause = 0.5
        while True:
            try:
                response = await self._http.post(
                    f"/api/relay/leases/{call.lease_id}/result",
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
            except httpx.TransportError as exc:
                log.warning("relay host: result of %s not sent (%s); again", call.key, _why(exc))
            except Exception as exc:  # a failure of this host's own making: told once
                log.error("relay host: result of %s not sent: %s", call.key, _named(exc))
                if refused:
                    return  # the lease lapses; the call is offered again
                refused = True
                body = _error_body(f"the host could not send the tool's result: {_named(exc)}")
                continue
            else:
                if response.status_code == 200:
                    self.served += 1
                    return
                if response.status_code in (404, 409):
                    # Another host, or a person, has the call now: this result is not taken.
                    log.warning("relay host: result of %s refused: %s", call.key, _detail(response))
                    return
                if not _passing(response.status_code):
                    refusal = f"({response.status_code}) {_detail(response)}"
                    log.error("relay host: result of %s refused %s", call.key, refusal)
                    if refused:
                        return  # the lease lapses; the call is offered again
                    # Too large, say: the model is told so, rather than the call being
                    # offered again, to fail the same way on every host.
                    refused = True
                    body = _error_body(f"the API refused the result {refusal}")
                    continue
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE)

    async def _release(self, call: LeasedCall) -> None:
        with contextlib.suppress(httpx.TransportError):
            await self._http.post(f"/api/relay/leases/{call.lease_id}/release")


def _result_body(output: str, is_error: bool) -> bytes:
    """The result's JSON; an error result saying why where the output cannot be sent."""
    try:
        result = LeaseResult.model_construct(output=output, is_error=is_error)
        return json.dumps(
            result.model_dump(by_alias=True), ensure_ascii=False, allow_nan=False
        ).encode()
    except ValueError as exc:  # UnicodeEncodeError among them: a lone surrogate
        return _error_body(f"the host could not send the tool's result: {_named(exc)}")


def _error_body(reason: str) -> bytes:
    result = LeaseResult.model_construct(output=reason[:2000], is_error=True)
    return json.dumps(result.model_dump(by_alias=True)).encode()


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Unavailable(Exception):
    """The API could not serve the request now: tried again, with backoff."""


def _passing(status: int) -> bool:
    """A 5xx (the API's store or broker away, a gateway's error, an API stopping or
    failing) or a 429 passes; any other refusal is this host's to fix."""
    return status >= 500 or status == 429


def _check(response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    if _passing(response.status_code):
        raise _Unavailable(response.status_code)
    raise HostRefused(response.status_code, _detail(response))


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    return str(detail or response.reason_phrase)


def _why(exc: BaseException) -> str:
    return type(exc).__name__ if not isinstance(exc, _Unavailable) else f"HTTP {exc.args[0]}"
