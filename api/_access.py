"""The access log, without secrets.

uvicorn logs each request's path with its query string. A token belongs in
the Authorization header (which is never logged), but a client may put one
in the URL anyway: `/api/runs?token=...` is refused, and must not be written
down either. So the access log keeps the values of the API's own filters
(`status`, `agent`, `kind`, `run_id`, `limit`) and replaces every other
value with `***`; anything key-shaped left in the line is redacted.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, quote

from relayq.limits import redact_secrets

__all__ = ["ACCESS_LOGGER", "WithoutSecrets", "install", "loggable"]

ACCESS_LOGGER = "uvicorn.access"
SHOWN = frozenset({"status", "agent", "kind", "run_id", "limit"})
"""Query parameters whose values the access log keeps: the API's filters, no secret."""


def loggable(path: str) -> str:
    """`path` (with its query string) as the access log may show it."""
    base, sep, query = path.partition("?")
    if sep:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{quote(k, safe='')}={quote(v, safe='') if k in SHOWN else '***'}" for k, v in pairs
        )
    return redact_secrets(base + sep + query)


class WithoutSecrets(logging.Filter):
    """Rewrites uvicorn's access records (`client - "METHOD path HTTP/x" status`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (*args[:2], loggable(args[2]), *args[3:])
        return True


def install() -> None:
    """Add the filter to uvicorn's access logger, once, however uvicorn was started."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, WithoutSecrets) for f in logger.filters):
        logger.addFilter(WithoutSecrets())
