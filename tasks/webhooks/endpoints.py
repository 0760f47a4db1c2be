"""Webhook endpoints as configured (`RELAYQ_WEBHOOKS`, `RELAYQ_PUBLIC_URL`), and how hard
each delivery is tried (`WebhookSettings`, a part of `tasks.settings.Settings`): parsed and
checked with the settings, before anything is sent (`tasks.webhooks.sender` sends)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal
from urllib.parse import urlsplit

from store.events import EVENT_TYPES
from store.webhooks import Subscription
from tasks.setting_fields import age, count, option

__all__ = [
    "DEFAULT_PUBLIC_URL",
    "Endpoint",
    "Format",
    "WebhookSettings",
    "parse_public_url",
    "parse_webhooks",
]

DEFAULT_PUBLIC_URL = "http://127.0.0.1:8000"

Format = Literal["json", "slack"]


@dataclass(frozen=True, kw_only=True, repr=False)
class Endpoint:
    """One receiver of webhooks. Its repr shows no URL (a Slack one is a secret) nor secret."""

    name: str
    """Its identity in the store: deliveries and the delivery log are keyed by it."""
    url: str
    secret: str = ""
    """The HMAC key of `X-Relayq-Signature`; empty (allowed for `slack` only): unsigned."""
    format: Format = "json"
    """`json`: the event as JSON. `slack`: a Slack message, `{"text": ...}`."""
    events: frozenset[str] | None = None
    """The event types it wants; None for all."""

    @property
    def subscription(self) -> Subscription:
        return Subscription(endpoint=self.name, events=self.events)

    def __repr__(self) -> str:
        host = urlsplit(self.url).hostname
        return f"Endpoint(name={self.name!r}, host={host!r}, format={self.format!r})"


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_KEYS = {"name", "url", "secret", "secret_env", "format", "events"}


def parse_webhooks(key: str, value: Any, env: Mapping[str, str]) -> tuple[Endpoint, ...]:
    """The endpoints of `RELAYQ_WEBHOOKS` (a JSON list) or `relayq_webhooks` (a list of
    dicts, or of `Endpoint`s); ValueError saying what is wrong, never quoting a URL or a
    secret. `secret_env` names the variable of `env` that holds an endpoint's secret."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{key} must be a JSON list of endpoints: {exc.msg}") from None
    if not isinstance(value, list | tuple):
        raise ValueError(f"{key} must be a list of endpoints, not {type(value).__name__}")
    endpoints = tuple(
        item if isinstance(item, Endpoint) else _endpoint(f"{key}[{i}]", item, env)
        for i, item in enumerate(value)
    )
    names = [e.name for e in endpoints]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{key}: endpoint names must be unique; {', '.join(twice)} repeat")
    return endpoints


def _endpoint(where: str, item: Any, env: Mapping[str, str]) -> Endpoint:
    if not isinstance(item, dict):
        raise ValueError(f"{where} must be an object with name, url, secret, format and events")
    unknown = sorted(set(item) - _KEYS)
    if unknown:
        raise ValueError(
            f"{where}: unknown key {unknown[0]!r}; keys are {', '.join(sorted(_KEYS))}"
        )
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{where}: name must be 1-64 letters, digits, '_', '.', ':' or '-'")
    where = f"{where} ({name})"
    fmt = item.get("format", "json")
    if fmt not in ("json", "slack"):
        raise ValueError(f"{where}: format must be 'json' or 'slack', not {fmt!r}")
    return Endpoint(
        name=name,
        url=_url(where, item.get("url")),
        secret=_secret(where, item, env, required=fmt == "json"),
        format=fmt,
        events=_events(where, item.get("events")),
    )


def _url(where: str, url: Any) -> str:
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where}: url must be an http:// or https:// URL with a host")
    return str(url)


def parse_public_url(key: str, value: Any) -> str:
    """`RELAYQ_PUBLIC_URL`: where people reach the API and its inbox, for links."""
    return _url(key, str(value)).rstrip("/")


def _secret(where: str, item: dict[str, Any], env: Mapping[str, str], *, required: bool) -> str:
    secret = item.get("secret")
    if "secret" in item and "secret_env" in item:
        raise ValueError(f"{where}: give secret or secret_env, not both")
    if "secret_env" in item:
        variable = item["secret_env"]
        secret = env.get(variable) if isinstance(variable, str) else None
        if not secret:
            raise ValueError(f"{where}: secret_env names {variable!r}, which is not set")
    if secret is None and not required:
        return ""
    if not isinstance(secret, str) or not secret:
        raise ValueError(f"{where}: a json endpoint needs a secret (or secret_env) to sign with")
    return secret


def _events(where: str, events: Any) -> frozenset[str] | None:
    if events is None:
        return None
    if not isinstance(events, list | tuple) or not events:
        raise ValueError(f"{where}: events must be a non-empty list of event types")
    unknown = sorted(str(e) for e in events if e not in EVENT_TYPES)
    if unknown:
        raise ValueError(
            f"{where}: unknown event type {unknown[0]!r}; known: {', '.join(EVENT_TYPES)}"
        )
    return frozenset(events)


@dataclass(frozen=True, kw_only=True)
class WebhookSettings:
    """Where events are delivered (`tasks.webhooks`), and how hard each is tried."""

    endpoints: tuple[Endpoint, ...] = option("webhooks", parse=None, default=())
    """The endpoints; their repr shows no URL or secret."""
    public_url: str = option("public_url", parse=parse_public_url, default=DEFAULT_PUBLIC_URL)
    """Where people reach the API and its inbox: the base of the links webhooks carry."""
    attempts: int = option("webhook_attempts", parse=count(1), default=40)
    """Attempts of one delivery before it is given up (`failed`)."""
    retry_base: timedelta = option("webhook_retry_base", default=timedelta(seconds=1))
    """Before a failed delivery's second attempt; doubles, up to an hour."""
    timeout: timedelta = option("webhook_timeout", default=timedelta(seconds=10))
    """What one attempt may take, from connecting to the reply's status."""
    concurrency: int = option("webhook_concurrency", parse=count(1), default=16)
    """Webhook requests in flight at once, per worker process."""
    retention: timedelta | None = option(
        "webhook_retention", parse=age, default=timedelta(days=7), shown="7d"
    )
    """Events older than this, with every delivery of theirs delivered or given up, are
    removed by the sweeps with their deliveries and attempts; None keeps them."""
