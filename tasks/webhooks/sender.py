"""Outbound webhooks: the sender every worker process runs, and what a receiver needs.

Configured with `RELAYQ_WEBHOOKS`, a JSON list of endpoints (or a list of
dicts in the Celery configuration, `relayq_webhooks`):

    [{"name": "ops", "url": "https://ops.example.com/relayq", "secret": "...",
      "format": "json", "events": ["request.opened", "run.failed"]}]

Each event goes to each endpoint that wants it, at least once (`store.webhooks`
keeps the deliveries, the retries and the delivery log). A request is a POST
whose headers say which event it is and sign it:

    X-Relayq-Event-Id: evt_...            the same on every attempt: drop duplicates by it
    X-Relayq-Event-Type: request.opened
    X-Relayq-Timestamp: 1767225600        unix seconds of this attempt
    X-Relayq-Signature: sha256=<hex HMAC-SHA256 of "{timestamp}.{body}" with the secret>

A receiver checks them with `verify_signature` (or the same three lines of its
own): `verify_signature(secret, headers["X-Relayq-Timestamp"], body,
headers["X-Relayq-Signature"])`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from store import Database
from store.models import utcnow
from store.webhooks import (
    Attempt,
    Due,
    Event,
    RetryPolicy,
)
from tasks.storeio import StoreCalls, StoreDoor
from tasks.webhooks.endpoints import (
    DEFAULT_PUBLIC_URL,
    Endpoint,
    WebhookSettings,
    parse_public_url,
    parse_webhooks,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_PUBLIC_URL",
    "Endpoint",
    "WebhookSender",
    "parse_public_url",
    "parse_webhooks",
    "render",
    "sign",
    "slack_text",
    "verify_signature",
]


log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Relayq-Signature"
POLL_EVERY = 1.0
"""Seconds between looks at the store while nothing is due."""
FANOUT_BATCH = 1000
DEFAULT_POLICY = RetryPolicy()


# -- signing --------------------------------------------------------------------------------------


def sign(secret: str, timestamp: int | str, body: bytes | str) -> str:
    """The `X-Relayq-Signature` value: `sha256=` and the hex HMAC of `"{timestamp}.{body}"`."""
    raw = body.encode() if isinstance(body, str) else body
    message = f"{timestamp}.".encode() + raw
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    timestamp: int | str,
    body: bytes | str,
    header: str,
    *,
    tolerance: timedelta = timedelta(minutes=5),
    now: datetime | None = None,
) -> bool:
    """Whether a request is relayq's: its signature fits, and it is not older (or newer)
    than `tolerance`, so a captured request cannot be replayed later.

    Pass the body exactly as received, before any JSON parsing:

        ok = verify_signature(secret, request.headers["X-Relayq-Timestamp"],
                              await request.body(), request.headers["X-Relayq-Signature"])
    """
    try:
        sent = int(timestamp)
    except (TypeError, ValueError):
        return False
    moment = time.time() if now is None else now.timestamp()
    if abs(moment - sent) > tolerance.total_seconds():
        return False
    expected = sign(secret, sent, body).encode()
    # Constant time, and any of several (a receiver rotating secrets may list two).
    return any(hmac.compare_digest(expected, part.strip().encode()) for part in header.split(","))


# -- bodies ---------------------------------------------------------------------------------------


def render(endpoint: Endpoint, event: Event, public_url: str) -> bytes:
    """The body sent to `endpoint` for `event`, as compact UTF-8 JSON."""
    if endpoint.format == "slack":
        body: dict[str, Any] = {"text": slack_text(event, public_url)}
    else:
        body = {
            "id": event.id,
            "type": event.type,
            "createdAt": event.created_at.isoformat(),
            "data": event.payload,
        }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


_TITLES = {
    "request.opened": "Request waiting",
    "request.reminder": "Reminder: request still waiting",
    "request.escalated": "Request escalated",
    "request.decided": "Request decided",
    "request.expired": "Request expired",
    "run.finished": "Run finished",
    "run.failed": "Run failed",
}


def slack_text(event: Event, public_url: str) -> str:
    """One readable line in Slack's mrkdwn, with a link to the request's page.

    "Request waiting: `refund` for agent `support`, run `run_1`
    <http://127.0.0.1:8000/requests/req_1|open request>" (on one line)
    """
    data = event.payload
    title = _TITLES.get(event.type, event.type)
    if event.type == "request.expired" and data.get("stillOpen"):
        title = "Request overdue, still open"
    subject = data.get("tool") or data.get("kind") or "run"
    text = f"{title}: `{_esc(subject)}` for agent `{_esc(data.get('agent'))}`"
    if event.run_id:
        text += f", run `{_esc(event.run_id)}`"
    text += _detail(event.type, data)
    if event.request_id:
        link = f"{public_url.rstrip('/')}/requests/{event.request_id}"
        text += f" <{_esc(link)}|open request>"
    return text


def _detail(kind: str, data: Mapping[str, Any]) -> str:
    """What the type adds to the line: the outcome, the new approvers, the error ..."""
    if kind == "request.decided":
        return f": {_esc(data.get('outcome'))} by {_esc(data.get('decidedBy'))}"
    if kind == "request.escalated":
        return f", now for {_esc(', '.join(data.get('approvers') or []))}"
    if kind == "request.reminder" and data.get("expiresAt"):
        return f", expires {_esc(data['expiresAt'])}"
    if kind == "run.finished":
        return f": {_esc(data.get('status'))}"
    if kind == "run.failed" and data.get("error"):
        return f": {_esc(data['error'])}"
    return ""


def _esc(value: Any) -> str:
    """Slack's mrkdwn escapes, & < >, so a value cannot make a link or a mention of its
    own; a backquote becomes ' so it cannot close the code span it sits in."""
    text = "" if value is None else str(value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")


def _headers(endpoint: Endpoint, event: Event, body: bytes, attempt: int) -> dict[str, str]:
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "relayq-webhooks",
        "X-Relayq-Event-Id": event.id,
        "X-Relayq-Event-Type": event.type,
        "X-Relayq-Timestamp": str(timestamp),
        "X-Relayq-Attempt": str(attempt),
    }
    if endpoint.secret:
        headers[SIGNATURE_HEADER] = sign(endpoint.secret, timestamp, body)
    return headers


# -- the sender -----------------------------------------------------------------------------------


class WebhookSender:
    """Fans events out, sends what is due, records each attempt; runs in every worker process.

    Processes share the work through the store: a delivery is claimed (locked,
    then leased) by one sender at a time, so more workers send more at once.
    """

    def __init__(
        self,
        db: Database,
        endpoints: Sequence[Endpoint],
        *,
        public_url: str = DEFAULT_PUBLIC_URL,
        policy: RetryPolicy = DEFAULT_POLICY,
        timeout: timedelta = timedelta(seconds=10),
        concurrency: int = 16,
        store: StoreDoor | None = None,
    ) -> None:
        self.endpoints = {e.name: e for e in endpoints}
        self.subscriptions = [e.subscription for e in endpoints]
        self.public_url = public_url
        self.policy = policy
        self.timeout = timeout
        self.concurrency = concurrency
        """Requests in flight at once, and so the size of a claimed batch."""
        self.lease = timeout * 2 + timedelta(seconds=30)
        """A batch is sent within one timeout; the rest is slack for recording it."""
        self.store = store or StoreDoor(db, StoreCalls(inline=db.is_sqlite, executor=lambda: None))
        """The owner's door to the store (a worker's runtime's), else one of its own."""
        self._client: httpx.AsyncClient | None = None

    @classmethod
    def from_settings(
        cls, hooks: WebhookSettings, db: Database, *, store: StoreDoor | None = None
    ) -> WebhookSender:
        return cls(
            db,
            hooks.endpoints,
            public_url=hooks.public_url,
            policy=RetryPolicy(attempts=hooks.attempts, base=hooks.retry_base),
            timeout=hooks.timeout,
            concurrency=hooks.concurrency,
            store=store,
        )

    async def run_forever(self) -> None:
        """Deliver, for the life of the process; a failing round is logged and tried again."""
        async with self.client():
            while True:
                try:
                    more = await self.once()
                except Exception as exc:
                    log.warning("webhook deliveries failed: %s", type(exc).__name__)
                    more = False
                # Yield even when more is due: the turns share this loop.
                await asyncio.sleep(0 if more else POLL_EVERY * random.uniform(0.8, 1.2))

    async def once(self) -> bool:
        """One round: fan out, claim a batch, send it, record it. True if more may be due now."""
        made = await self.store.fan_out(self.subscriptions, limit=FANOUT_BATCH)
        due: list[Due] = await self.store.claim_due(
            list(self.endpoints), lease=self.lease, limit=self.concurrency
        )
        if due:
            attempts = await asyncio.gather(*(self.send(d) for d in due))
            await self.store.record_deliveries(attempts, policy=self.policy)
        return made == FANOUT_BATCH or len(due) == self.concurrency

    async def send(self, due: Due) -> Attempt:
        """One attempt: a 2xx delivers; any other status, a refusal or a timeout is retried."""
        endpoint = self.endpoints[due.endpoint]
        body = render(endpoint, due.event, self.public_url)
        headers = _headers(endpoint, due.event, body, due.attempt)
        started = time.monotonic()
        try:
            # A total deadline: httpx's timeout holds per read, and a trickling reply
            # must not outlive the lease.
            async with asyncio.timeout(self.timeout.total_seconds()):
                status, retry_after = await self._post(endpoint.url, body, headers)
        except Exception as exc:  # whatever went wrong, it is this attempt's: logged, retried
            return Attempt(
                delivery_id=due.delivery_id,
                error=_describe(exc, endpoint),
                duration=timedelta(seconds=time.monotonic() - started),
            )
        return Attempt(
            delivery_id=due.delivery_id,
            status=status,
            error=None if 200 <= status < 300 else f"HTTP {status}",
            duration=timedelta(seconds=time.monotonic() - started),
            retry_after=retry_after,
        )

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, timedelta | None]:
        # Streamed and never read: a receiver's reply body is of no use, whatever its size.
        async with self.http.stream("POST", url, content=body, headers=headers) as response:
            return response.status_code, _retry_after(response.headers.get("Retry-After"))

    @property
    def http(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("WebhookSender.send outside `async with sender.client()`")
        return self._client

    @asynccontextmanager
    async def client(self) -> AsyncIterator[httpx.AsyncClient]:
        """The HTTP client, open on the running loop: `async with sender.client(): ...`."""
        # Imported here, by the one process that delivers: every process reads the
        # webhook settings, and httpx (with rich and pygments) is 0.2 s of a start.
        import httpx

        seconds = self.timeout.total_seconds()
        hide = _HideUrls(self.endpoints.values())
        _HTTPX_LOG.addFilter(hide)
        try:
            async with httpx.AsyncClient(
                timeout=httpx.Timeout(seconds, connect=min(seconds, 5.0)),
                follow_redirects=False,  # a 3xx is no delivery: the URL is the operator's to fix
                limits=httpx.Limits(max_connections=self.concurrency),
            ) as client:
                self._client = client
                yield client
        finally:
            self._client = None
            _HTTPX_LOG.removeFilter(hide)


_HTTPX_LOG = logging.getLogger("httpx")


class _HideUrls(logging.Filter):
    """httpx logs every request's URL (at INFO); a webhook's URL may be its secret (Slack's
    is), so its log lines name the endpoint instead."""

    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        import httpx

        super().__init__()
        self.names = {str(httpx.URL(e.url)): f"<webhook {e.name}>" for e in endpoints}

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.names.get(str(a), a) for a in record.args)
        return True


def _retry_after(value: str | None) -> timedelta | None:
    """`Retry-After` in seconds or as an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    if value.strip().isdigit():
        return timedelta(seconds=int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(timedelta(0), when - utcnow())


def _describe(exc: BaseException, endpoint: Endpoint) -> str:
    """A failure in a few words for the delivery log: its type and message, without the URL."""
    message = str(exc).replace(endpoint.url, f"<{endpoint.name}>")
    if endpoint.secret:
        message = message.replace(endpoint.secret, "[secret]")
    text = type(exc).__name__ + (f": {message}" if message else "")
    return text[:200]
