"""The relay lease protocol's wire, written once for the store, the API and the host SDK.

    POST /api/relay/leases                      LeaseAsk  -> LeasePage
    POST /api/relay/leases/{leaseId}/heartbeat            -> Expiry
    POST /api/relay/leases/{leaseId}/result     LeaseResult

Fields are camelCase on the wire (`relayq.wire`); a body with a field the protocol
does not name is refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictBool

from relayq.wire import CamelModel

__all__ = [
    "MAX_LEASES",
    "MAX_WAIT",
    "Expiry",
    "LeaseAsk",
    "LeasePage",
    "LeaseResult",
    "LeasedCall",
]

MAX_WAIT = 60.0
"""Seconds a lease may be waited for in one request (a proxy's idle timeout is often 60)."""
MAX_LEASES = 100
"""Calls one lease request may take."""


class _Wire(CamelModel):
    model_config = ConfigDict(extra="forbid")


class LeaseAsk(_Wire):
    """What a host asks for: calls of these tools, at most `max`, waiting up to `wait` s."""

    tools: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(
        min_length=1, max_length=100
    )
    max: int = Field(default=10, ge=1, le=MAX_LEASES)
    wait: float = Field(default=0.0, ge=0.0, le=MAX_WAIT)
    lease_seconds: float = Field(default=60.0, ge=1.0, le=3600.0)


class LeasedCall(_Wire):
    """One relay call leased to one host until `expires_at`: as the API sends it, and as
    the host's tool function sees it."""

    model_config = ConfigDict(frozen=True)

    lease_id: str
    request_id: str
    run_id: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    attempt: int
    """1 on the call's first lease; one more each time a lease lapsed or was handed back:
    with the run and call ids, a key a host can use to act once."""
    expires_at: datetime

    @property
    def key(self) -> str:
        """`runId:callId:attempt`: one try of this call."""
        return f"{self.run_id}:{self.call_id}:{self.attempt}"


class LeasePage(_Wire):
    leases: list[LeasedCall]


class Expiry(_Wire):
    expires_at: datetime


class LeaseResult(_Wire):
    """The leased call's result."""

    output: str
    is_error: StrictBool = False
