"""Relay calls leased to hosts: each open relay call offered to one host at a time.

A relay request's calls get a row each in `relayq_relay_calls` when the request
opens (`store.requests.open_request`). A host leases calls by tool name: the
oldest calls of open requests that have no result and no live lease, each taken
for `lease` seconds under a new lease id (`relayq_leases` keeps every lease, so
a late caller learns why its lease no longer holds). A lease ends with the
call's result, which goes through the answer path (`store.answers`) as a
partial answer, so the request is answered once its last call has a result; or
released, or expired, after which the call is offered again, its `attempt` one
more. The host's name goes into the audit trail with each result.

A result, heartbeat or release on a lease that no longer holds changes nothing
and raises LeaseLost: it expired, was released, was superseded by a later
lease of the same call, or its request was answered, expired or cancelled
meanwhile (a person answering in the inbox ends the leases of what they answer).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func, or_
from sqlmodel import Session, col, select
from sqlmodel.sql.expression import SelectOfScalar

from relayq import Answer, RelayqError
from relayq.leases import LeasedCall
from relayq.relay import RelayResult
from relayq.replies import Results, answer_to
from store.answers import Accepted, accept_in
from store.audit import Decider
from store.db import Database
from store.models import LeaseRow, RelayCallRow, RequestRow, RunRow, utcnow

__all__ = [
    "Lease",
    "LeaseDone",
    "LeaseLost",
    "LeaseRefused",
    "UnknownLease",
    "heartbeat_lease",
    "lease_calls",
    "lease_result",
    "offered",
    "release_lease",
]

_CLOSING = ("error", "cancel")
"""`on_expiry` values whose deadline closes a request (others leave it open)."""


class UnknownLease(RelayqError):
    """No lease has this id."""

    def __init__(self, lease_id: str) -> None:
        super().__init__(f"unknown lease id {lease_id!r} (never granted, or removed with its run)")
        self.args = (lease_id,)
        self.lease_id = lease_id

    def __str__(self) -> str:
        return f"unknown lease id {self.lease_id!r} (never granted, or removed with its run)"


class LeaseRefused(RelayqError):
    """The lease is another holder's, or of a tool the caller may not serve; nothing was
    changed."""

    def __init__(self, lease_id: str, message: str) -> None:
        super().__init__(message)
        self.args = (lease_id, message)
        self.lease_id = lease_id
        self.message = message

    def __str__(self) -> str:
        return self.message


class LeaseLost(RelayqError):
    """The lease no longer holds its call (`.reason`: expired, released, superseded,
    done, or ended with its request); nothing was changed."""

    def __init__(self, lease_id: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.args = (lease_id, reason, message)
        self.lease_id = lease_id
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class LeaseDone:
    """A leased call's result, taken: the answer it made, as given and as taken
    (`Accepted`), and what it answered."""

    answer: Answer
    accepted: Accepted
    request_id: str
    call_id: str


class Lease(LeasedCall):
    """One relay call, leased to `holder` until `expires_at` (the wire's `LeasedCall`,
    and who holds it)."""

    holder: str


def lease_calls(
    db: Database,
    *,
    tools: Collection[str] | None,
    holder: str,
    limit: int,
    lease: timedelta,
    now: datetime | None = None,
) -> list[Lease]:
    """Lease up to `limit` relay calls to `holder`, the oldest first: calls of open
    requests whose tool is in `tools` (None: any tool), with no result and no live lease."""
    now = now or utcnow()
    until = now + lease
    # Every lease request looks first: with nothing to offer, a read answers (a statement
    # built once), and SQLite's write lock is not taken for it.
    with db.connect() as conn:
        if conn.execute(_ANY[tools is not None], _params(tools, now)).first() is None:
            return []
    with db.write() as s:
        offered = s.exec(_offer(tools, now, limit, skip_locked=not db.is_sqlite)).all()
        if not offered:
            return []
        requests = {
            row.id: row
            for row in s.exec(
                select(RequestRow).where(col(RequestRow.id).in_({c.request_id for c in offered}))
            )
        }
        leases = []
        for call in offered:
            lease_id = f"lease_{uuid.uuid4().hex}"
            call.attempt += 1
            call.lease_id, call.holder, call.lease_until = lease_id, holder, until
            s.add(call)
            s.add(
                LeaseRow(
                    id=lease_id,
                    request_id=call.request_id,
                    call_id=call.call_id,
                    holder=holder,
                    attempt=call.attempt,
                    seconds=lease.total_seconds(),
                    status="held",
                    expires_at=until,
                    created_at=now,
                )
            )
            leases.append(
                Lease(
                    lease_id=lease_id,
                    request_id=call.request_id,
                    run_id=call.run_id,
                    call_id=call.call_id,
                    name=call.name,
                    arguments=_arguments(requests[call.request_id], call.call_id),
                    attempt=call.attempt,
                    expires_at=until,
                    holder=holder,
                )
            )
        return leases


def heartbeat_lease(
    db: Database,
    lease_id: str,
    *,
    holder: str | None = None,
    tools: Collection[str] | None = None,
    now: datetime | None = None,
) -> datetime:
    """Extend a lease that still holds by its length; returns when it now expires.

    With `holder`, only that holder's lease (else LeaseRefused); with `tools`, only a
    lease of one of them (the callers of every lease verb take both)."""
    now = now or utcnow()
    with db.write() as s:
        lease, call = _holding(s, lease_id, now, holder, tools)
        until = now + timedelta(seconds=lease.seconds)
        lease.expires_at = call.lease_until = until
        s.add(lease)
        s.add(call)
        return until


def release_lease(
    db: Database,
    lease_id: str,
    *,
    holder: str | None = None,
    tools: Collection[str] | None = None,
    now: datetime | None = None,
) -> None:
    """Hand a leased call back at once: it is offered again (its next lease's attempt one
    more). Refuses as `heartbeat_lease` does."""
    now = now or utcnow()
    with db.write() as s:
        lease, call = _holding(s, lease_id, now, holder, tools)
        lease.status = "released"
        call.lease_id = call.holder = call.lease_until = None
        s.add(lease)
        s.add(call)


def lease_result(
    db: Database,
    lease_id: str,
    *,
    output: str,
    is_error: bool,
    host: Decider,
    tools: Collection[str] | None = None,
    max_bytes: int | None = None,
    now: datetime | None = None,
) -> LeaseDone:
    """Record the leased call's result, as a partial answer of its request by `host`
    (the lease's holder): the request is answered (and its answer task queued) once every
    call has a result. Refuses as `heartbeat_lease` does, and an output the store cannot
    keep (over `max_bytes`) as `accept_answer` does."""
    now = now or utcnow()
    with db.write() as s:
        lease, call = _holding(s, lease_id, now, host.name, tools)
        result = RelayResult(id=call.call_id, output=output, is_error=is_error)
        answer = answer_to(call.request_id, Results([result]))
        accepted = accept_in(s, answer, host, partial=True, now=now, max_bytes=max_bytes)
        lease.status = "done"
        s.add(lease)
        return LeaseDone(answer, accepted, call.request_id, call.call_id)


def _holding(
    s: Session,
    lease_id: str,
    now: datetime,
    holder: str | None,
    tools: Collection[str] | None,
) -> tuple[LeaseRow, RelayCallRow]:
    """The lease and its call, locked (the run first, as every answer path locks it), if
    the lease still holds; else LeaseLost (or UnknownLease, or LeaseRefused)."""
    lease = s.get(LeaseRow, lease_id)
    if lease is None:
        raise UnknownLease(lease_id)
    if holder is not None and lease.holder != holder:
        raise LeaseRefused(lease_id, f"lease {lease_id} is not {holder}'s")
    name = s.exec(
        select(RelayCallRow.name).where(
            RelayCallRow.request_id == lease.request_id, RelayCallRow.call_id == lease.call_id
        )
    ).first()
    if tools is not None and name not in tools:
        raise LeaseRefused(lease_id, f"lease {lease_id} is of tool {name!r}, not served here")
    run_id = s.exec(select(RequestRow.run_id).where(RequestRow.id == lease.request_id)).first()
    run = None if run_id is None else s.get(RunRow, run_id, with_for_update=True)
    call = s.get(RelayCallRow, (lease.request_id, lease.call_id), with_for_update=True)
    s.refresh(lease, with_for_update=True)
    what = f"lease {lease_id} of call {lease.call_id}"
    if lease.status != "held":
        raise LeaseLost(lease_id, lease.status, f"{what} is {lease.status}")
    if call is None or call.answered:
        raise LeaseLost(lease_id, "ended", f"{what} ended: the call has its result")
    if call.lease_id != lease_id:
        raise LeaseLost(lease_id, "superseded", f"{what} was superseded by a later lease")
    if lease.expires_at <= now:
        raise LeaseLost(lease_id, "expired", f"{what} expired at {lease.expires_at.isoformat()}")
    request = s.get(RequestRow, lease.request_id)
    if request is None or request.status != "open" or run is None or run.status != "pending":
        status = "gone" if request is None else request.status
        raise LeaseLost(lease_id, "ended", f"{what} ended: its request is {status}")
    # A deadline that closes the request closes it from that moment on, swept or not.
    deadline = request.expires_at if request.on_expiry in _CLOSING else None
    if deadline is not None and deadline <= now:
        when = deadline.isoformat()
        raise LeaseLost(lease_id, "ended", f"{what} ended: its request expired at {when}")
    return lease, call


def _offerable(now: Any) -> list[Any]:
    """What makes a call one a host may lease now."""
    runs, requests = RunRow, RequestRow
    return [
        col(RelayCallRow.answered).is_(False),
        or_(col(RelayCallRow.lease_until).is_(None), col(RelayCallRow.lease_until) <= now),
        requests.status == "open",
        # A deadline that closes the request closes it from that moment on, swept or not.
        or_(
            col(requests.expires_at).is_(None),
            col(requests.expires_at) > now,
            col(requests.on_expiry).not_in(_CLOSING),
        ),
        runs.status == "pending",
        col(runs.cancel_requested).is_(False),
    ]


def _offer(
    tools: Collection[str] | None, now: datetime, limit: int, *, skip_locked: bool
) -> SelectOfScalar[RelayCallRow]:
    """The oldest calls a host may lease now."""
    query = (
        select(RelayCallRow)
        .join(RequestRow, col(RequestRow.id) == RelayCallRow.request_id)
        .join(RunRow, col(RunRow.id) == RelayCallRow.run_id)
        .where(*_offerable(now))
        .order_by(col(RelayCallRow.created_at), col(RelayCallRow.request_id))
        .limit(limit)
    )
    if tools is not None:
        query = query.where(col(RelayCallRow.name).in_(sorted(tools)))
    if skip_locked:
        # Hosts racing for calls take different ones rather than waiting on each other.
        query = query.with_for_update(of=RelayCallRow, skip_locked=True)
    return query


def offered(
    db: Database, tools: Collection[str] | None, *, now: datetime | None = None
) -> dict[str, int]:
    """How many calls of each of `tools` (None: any tool) a host may lease now, in one
    read: what the API's lease waits are woken by (`tasks.client.offers`)."""
    with db.connect() as conn:
        found = conn.execute(_COUNTS[tools is not None], _params(tools, now or utcnow()))
        return {name: int(count) for name, count in found}


def _params(tools: Collection[str] | None, now: datetime) -> dict[str, Any]:
    return {"now": now} if tools is None else {"now": now, "tools": sorted(tools)}


def _offered(*columns: Any, named: bool) -> Any:
    """The calls a host may lease at `:now` (of the tools `:tools`, if `named`)."""
    query = (
        select(*columns)
        .join(RequestRow, col(RequestRow.id) == RelayCallRow.request_id)
        .join(RunRow, col(RunRow.id) == RelayCallRow.run_id)
        .where(*_offerable(bindparam("now")))
    )
    if named:
        query = query.where(col(RelayCallRow.name).in_(bindparam("tools", expanding=True)))
    return query


# The reads every lease request and every look for waiting ones make, built once: by
# whether they name tools.
_ANY = {named: _offered(RelayCallRow.call_id, named=named).limit(1) for named in (False, True)}
_COUNTS = {
    named: _offered(RelayCallRow.name, func.count(), named=named).group_by(col(RelayCallRow.name))
    for named in (False, True)
}


def _arguments(request: RequestRow, call_id: str) -> dict[str, Any]:
    """The call's parsed arguments (its `input` on the wire)."""
    for call in request.calls or []:
        if call.get("id") == call_id:
            parsed = call.get("input")
            return parsed if isinstance(parsed, dict) else {}
    return {}
