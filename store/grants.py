"""Standing grants in the store: made, used, listed and revoked (`relayq.grants`).

A grant's use is counted in the transaction that approves the call it covers, with
its row in the audit trail (`through: "grant:<id>"`): the count is a guarded update
(`uses < max_uses`, not revoked, not expired, at that instant), so racing workers
never use a grant more than `max_uses` times, and a grant revoked or expired is used
by no call that starts after that moment. A call run again after its worker died
finds its row in the trail and is approved by the same grant, not counted twice.

Who may: a grant made with a decision is its decider's (the decision's own checks
say who may decide); one made directly is an administrator's (`admin`, or the
deployment's own Python and CLI). A grant is revoked by an administrator or by
whoever made it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeAlias

from sqlalchemy import and_, bindparam, or_, union_all, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from relayq import Answer, RelayqError, Request, new_id
from relayq.approvals import arguments_of, decision_of, is_tool_approval, policy_of
from relayq.grants import MAX_USES, SCOPES, GrantCaps, GrantScope, GrantTerms
from relayq.matching import Matcher
from relayq.policies import GrantAsk, PolicyNote
from relayq.wire import CamelModel
from store.audit import Decider, noted, policy_row
from store.db import Database
from store.models import DecisionRow, GrantRow, RequestRow, RunRow, UTCDateTime, utcnow
from store.paging import BadQuery, decode_cursor, encode_cursor

__all__ = [
    "ADMINS",
    "GrantQuery",
    "GrantRefused",
    "GrantStatus",
    "GrantView",
    "NewGrant",
    "UnknownGrant",
    "get_grant",
    "grant_in",
    "grant_with_decision",
    "grants_of_request",
    "list_grants",
    "make_grant",
    "revoke_grant",
    "status_of",
    "use_grant",
]

ADMINS = frozenset({"admin", None, "cli", "system"})
"""Who may make any grant and revoke any: the admin role, and the deployment's own
Python and CLI (`relayq.authority.LOCAL_ROLES`)."""

GrantStatus: TypeAlias = Literal["active", "expired", "revoked", "used"]


class UnknownGrant(RelayqError):
    """No grant has this id (404 over HTTP)."""

    def __init__(self, grant_id: str) -> None:
        super().__init__(grant_id)
        self.grant_id = grant_id

    def __str__(self) -> str:
        return f"unknown grant id {self.grant_id!r}"


class GrantRefused(RelayqError):
    """A grant that may not be made or revoked: `.forbidden` for who asked (403), else
    for what it asks (422). Nothing was changed."""

    def __init__(self, message: str, *, forbidden: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.forbidden = forbidden

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, kw_only=True)
class NewGrant:
    """A grant as made: what it covers, who made it and why."""

    tool: str
    agent: str | None
    """None: every agent with the tool (scope `all` only)."""
    scope: GrantScope
    scope_id: str | None
    """The run, the conversation or the principal it covers (None for agent and all)."""
    matcher: Matcher
    lasts: timedelta
    max_uses: int | None
    maker: Decider
    reason: str | None = None
    from_request: str | None = None

    def __post_init__(self) -> None:
        needs_id = self.scope in ("run", "conversation", "principal")
        if needs_id != bool(self.scope_id):
            raise GrantRefused(
                f"a grant of scope {self.scope!r} "
                + (
                    "names the run, conversation or principal it covers"
                    if needs_id
                    else "names no id"
                )
            )
        if self.agent is None and self.scope != "all":
            raise GrantRefused(f"a grant of scope {self.scope!r} names its agent")
        if not self.tool:
            raise GrantRefused("a grant names its tool")
        if self.scope not in SCOPES:
            raise GrantRefused(f"a grant's scope is one of {', '.join(SCOPES)}, not {self.scope!r}")
        if self.max_uses is not None and not 1 <= self.max_uses <= MAX_USES:
            raise GrantRefused(f"max_uses is a whole number from 1 to {MAX_USES:,}")


def make_grant(
    db: Database, grant: NewGrant, *, caps: GrantCaps | None = None, quorum: int = 1
) -> GrantRow:
    """An administrator's grant; GrantRefused for a maker who is not one, or for what the
    tool's policy (`caps`, where known) does not let a grant do."""
    if grant.maker.role not in ADMINS:
        raise GrantRefused(
            f"role {grant.maker.role!r} may not make a grant directly; approvers make one "
            "with a decision",
            forbidden=True,
        )
    with db.write() as s:
        return grant_in(s, grant, caps=caps, quorum=quorum, now=utcnow())


def grant_in(
    s: Session, grant: NewGrant, *, caps: GrantCaps | None, quorum: int, now: datetime
) -> GrantRow:
    """Add `grant` in the caller's transaction (a decision's, for one made with it)."""
    if caps is not None and (why := caps.refusal(grant.scope, grant.lasts, quorum)):
        raise GrantRefused(why)
    row = GrantRow(
        id=new_id("grt"),
        tool=grant.tool,
        agent=grant.agent,
        scope=grant.scope,
        scope_id=grant.scope_id,
        match=grant.matcher.to_wire(),
        max_uses=grant.max_uses,
        uses=0,
        maker_groups=None if grant.maker.role in ADMINS else list(grant.maker.groups),
        made_by=grant.maker.name,
        made_role=grant.maker.role,
        made_via=grant.maker.via,
        reason=grant.reason,
        from_request=grant.from_request,
        created_at=now,
        expires_at=now + grant.lasts,
    )
    s.add(row)
    return row


def grant_with_decision(
    s: Session,
    row: RequestRow,
    run: RunRow,
    request: Request,
    answer: Answer,
    who: Decider,
    terms: GrantTerms,
    now: datetime,
) -> GrantRow:
    """The grant a decider asks for with their approval of `request`, in the decision's
    transaction: it covers calls of the request's tool and agent in the scope asked, the
    decided arguments (`match: exact`, an edit's too) or those meeting the constraints.
    GrantRefused, the decision undone with it, for what the tool's policy does not let
    a grant do."""
    if who.role not in ADMINS | {"approver"}:
        raise GrantRefused(f"role {who.role!r} may not make a grant", forbidden=True)
    if not is_tool_approval(request):
        raise GrantRefused(
            f"request {row.id} is a {row.kind} request: a grant is made approving a gated "
            "tool's call"
        )
    decided = decision_of(request, answer)
    if decided.kind == "decline":
        raise GrantRefused("a grant goes with an approval, not with a decline")
    if terms.scope == "principal" and not run.started_by:
        raise GrantRefused(
            f"run {run.id} names no one who started it: scope 'principal' covers the runs "
            "of the one who did"
        )
    policy = policy_of(request)
    scope_id = {
        "run": run.id,
        "conversation": run.conversation_id,
        "principal": run.started_by,
    }.get(terms.scope)
    grant = NewGrant(
        tool=str(request.data.get("tool") or row.tool),
        agent=None if terms.scope == "all" else run.agent,
        scope=terms.scope,
        scope_id=scope_id,
        matcher=terms.matcher(decided.arguments or arguments_of(request)),
        lasts=terms.lasts,
        max_uses=terms.max_uses,
        maker=who,
        from_request=row.id,
    )
    return grant_in(s, grant, caps=policy.grants, quorum=policy.quorum, now=now)


def use_grant(db: Database, ask: GrantAsk) -> str | None:
    """The id of a grant that approves the call `ask` describes, its use counted and its
    row in the audit trail, in one transaction; None where none does. A grant past what
    the tool's policy lets grants do (`ask.caps`) approves nothing.

    The grants that could cover the call are found by a read: a call no grant covers,
    the common case, takes no write transaction (on SQLite, no turn of any worker waits
    on it). The write counts a use only where the grant is still usable at that instant.
    """
    with db.read() as s:
        kept = noted(s, ask.call_key)
        if kept is not None:  # the call ran before: whatever approved it then stands
            return _grant_of(kept)
        fitting = [row.id for row in _candidates(s, ask, utcnow()) if _may_cover(row, ask)]
    if not fitting:
        return None
    now = utcnow()
    try:
        with db.write() as s:
            kept = noted(s, ask.call_key)
            if kept is not None:  # another execution of the call was approved meanwhile
                return _grant_of(kept)
            for grant_id in fitting:
                if _count_use(s, grant_id, now):
                    s.add(policy_row(_used(ask, grant_id), now=now))
                    return grant_id
            return None  # each was used up, revoked or expired since it was read
    except IntegrityError:  # another execution of the call was approved in between
        with db.read() as s:
            return _grant_of(noted(s, ask.call_key))


def _grant_of(row: DecisionRow | None) -> str | None:
    through = (row.through if row is not None else "") or ""
    return through.removeprefix("grant:") if through.startswith("grant:") else None


def _usable_at(now: Any) -> Any:
    """Not revoked, not expired at `now` (a moment, or a bound parameter), not used up."""
    return and_(
        col(GrantRow.revoked_at).is_(None),
        col(GrantRow.expires_at) > now,
        or_(col(GrantRow.max_uses).is_(None), col(GrantRow.uses) < col(GrantRow.max_uses)),
    )


def _scoped(scope: str, *where: Any) -> Any:
    return and_(col(GrantRow.scope) == scope, *where)


# Built once, as the turn's own statements are (`store.statements`): building it anew took
# more of a call's time than running it. One arm a scope, so that each seeks the lookup
# index, (tool, scope, scope_id), rather than the store scanning every grant of the tool
# for an OR of them all. A NULL conversation or starter matches no row.
_AGENT: Any = bindparam("agent")
_TOOL: Any = bindparam("tool")
_NOW: Any = bindparam("now", type_=UTCDateTime())
_ARMS = [
    ("run", col(GrantRow.scope_id) == bindparam("run")),
    ("conversation", col(GrantRow.scope_id) == bindparam("conversation")),
    (
        "principal",
        and_(col(GrantRow.scope_id) == bindparam("starter"), col(GrantRow.agent) == _AGENT),
    ),
    ("agent", and_(col(GrantRow.scope_id).is_(None), col(GrantRow.agent) == _AGENT)),
    (
        "all",
        and_(
            col(GrantRow.scope_id).is_(None),
            or_(col(GrantRow.agent).is_(None), col(GrantRow.agent) == _AGENT),
        ),
    ),
]
_IDS = union_all(
    *(
        select(col(GrantRow.id)).where(
            col(GrantRow.tool) == _TOOL, col(GrantRow.scope) == scope, covers, _usable_at(_NOW)
        )
        for scope, covers in _ARMS
    )
).subquery()
_CANDIDATES = select(GrantRow).where(col(GrantRow.id).in_(select(_IDS.c.id)))


def _candidates(s: Session, ask: GrantAsk, now: datetime) -> list[GrantRow]:
    """The usable grants of the call's tool whose scope covers its run, narrowest first."""
    params = {
        "tool": ask.tool,
        "now": now,
        "run": ask.run_id,
        "conversation": ask.conversation_id,
        "starter": ask.started_by,
        "agent": ask.agent,
    }
    rows = list(s.exec(_CANDIDATES, params=params))
    return sorted(rows, key=lambda r: (SCOPES.index(r.scope), r.created_at, r.id))


def _may_cover(row: GrantRow, ask: GrantAsk) -> bool:
    """Whether the grant may approve the call: within what the tool's policy lets grants
    do, and what its maker could have approved of the call (a grant never widens it)."""
    lasted = row.expires_at - row.created_at
    if ask.caps.refusal(row.scope, lasted, ask.quorum) is not None:  # type: ignore[arg-type]
        return False
    if ask.forbid_self_approval and ask.started_by == row.made_by:
        return False
    groups = row.maker_groups
    if ask.approvers and groups is not None and not set(ask.approvers) & set(groups):
        return False
    return _matcher(json.dumps(row.match, sort_keys=True)).matches(ask.arguments)


@functools.lru_cache(maxsize=4096)
def _matcher(wire: str) -> Matcher:
    """A grant's matcher, parsed once: the same grants are looked at call after call."""
    return Matcher.from_wire(json.loads(wire))


def _count_use(s: Session, grant_id: str, now: datetime) -> bool:
    counted = s.exec(
        update(GrantRow)
        .where(col(GrantRow.id) == grant_id, _usable_at(now))
        .values(uses=col(GrantRow.uses) + 1)
    )
    return bool(counted.rowcount)


def _used(ask: GrantAsk, grant_id: str) -> PolicyNote:
    return PolicyNote(
        run_id=ask.run_id,
        call_id=ask.call_id,
        call_key=ask.call_key,
        agent=ask.agent,
        tool=ask.tool,
        outcome="approved",
        through=f"grant:{grant_id}",
        reason="a standing grant covers the call",
        arguments_hash=ask.arguments_hash,
    )


def get_grant(db: Database, grant_id: str) -> GrantRow:
    with db.read() as s:
        row = s.get(GrantRow, grant_id)
    if row is None:
        raise UnknownGrant(grant_id)
    return row


def revoke_grant(db: Database, grant_id: str, by: Decider) -> GrantRow:
    """Revoke the grant from this moment: no call that starts after it is approved by it.
    Revoking a revoked grant changes nothing. GrantRefused for one neither an
    administrator nor the grant's maker."""
    with db.write() as s:
        row = s.get(GrantRow, grant_id, with_for_update=True)
        if row is None:
            raise UnknownGrant(grant_id)
        if by.role not in ADMINS and by.name != row.made_by:
            raise GrantRefused(
                f"grant {grant_id} is {row.made_by}'s: only its maker or an administrator "
                "revokes it",
                forbidden=True,
            )
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            row.revoked_by = by.name
        return row


def status_of(row: GrantRow, now: datetime | None = None) -> GrantStatus:
    moment = now or utcnow()
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at <= moment:
        return "expired"
    if row.max_uses is not None and row.uses >= row.max_uses:
        return "used"
    return "active"


@dataclass(frozen=True, kw_only=True)
class GrantQuery:
    """Which grants to list, newest first, and which page."""

    tool: str | None = None
    agent: str | None = None
    scope: str | None = None
    made_by: str | None = None
    status: GrantStatus | None = None
    cursor: str | None = None
    limit: int = 50


_LISTING = "grants"


def list_grants(db: Database, query: GrantQuery | None = None) -> tuple[list[GrantRow], str | None]:
    """Grants, newest first, filtered; and the cursor of the next page (None: the last)."""
    q = query or GrantQuery()
    if q.status is not None and q.status not in ("active", "expired", "revoked", "used"):
        raise BadQuery(f"status is active, expired, revoked or used, not {q.status!r}", "status")
    if q.scope is not None and q.scope not in SCOPES:
        raise BadQuery(f"scope is one of {', '.join(SCOPES)}, not {q.scope!r}", "scope")
    now = utcnow()
    listing = select(GrantRow).order_by(col(GrantRow.created_at).desc(), col(GrantRow.id).desc())
    for name in ("tool", "agent", "scope", "made_by"):
        value = getattr(q, name)
        if value:
            listing = listing.where(getattr(GrantRow, name) == value)
    listing = _of_status(listing, q.status, now)
    if q.cursor:
        at, last = decode_cursor(q.cursor, scope=_LISTING, size=2)
        try:
            moment = datetime.fromisoformat(str(at))
        except ValueError:
            raise BadQuery("bad cursor", "cursor") from None
        listing = listing.where(
            or_(
                col(GrantRow.created_at) < moment,
                and_(col(GrantRow.created_at) == moment, col(GrantRow.id) < str(last)),
            )
        )
    with db.read() as s:
        rows = list(s.exec(listing.limit(q.limit + 1)))
    after = None
    if len(rows) > q.limit:
        rows = rows[: q.limit]
        after = encode_cursor([rows[-1].created_at.isoformat(), rows[-1].id], scope=_LISTING)
    return rows, after


def _of_status(listing: Any, status: GrantStatus | None, now: datetime) -> Any:
    if status is None:
        return listing
    if status == "revoked":
        return listing.where(col(GrantRow.revoked_at).is_not(None))
    live = col(GrantRow.revoked_at).is_(None)
    if status == "expired":
        return listing.where(live, col(GrantRow.expires_at) <= now)
    spent = and_(col(GrantRow.max_uses).is_not(None), col(GrantRow.uses) >= col(GrantRow.max_uses))
    if status == "used":
        return listing.where(live, col(GrantRow.expires_at) > now, spent)
    return listing.where(_usable_at(now))


def grants_of_request(db: Database, request_ids: Sequence[str]) -> list[GrantRow]:
    """The grants made with decisions on these requests."""
    with db.read() as s:
        return list(
            s.exec(select(GrantRow).where(col(GrantRow.from_request).in_(list(request_ids))))
        )


class GrantView(CamelModel):
    """A grant, and where it stands now."""

    id: str
    tool: str
    agent: str | None
    scope: str
    scope_id: str | None
    match: dict[str, Any]
    max_uses: int | None
    uses: int
    status: GrantStatus
    """active, expired, revoked or used (up)."""
    made_by: str
    made_role: str | None
    made_via: str
    reason: str | None
    from_request: str | None
    maker_groups: list[str] | None
    """The approver groups its maker decided for (None: an administrator's)."""
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None

    @classmethod
    def of(cls, row: GrantRow) -> GrantView:
        return cls(
            id=row.id,
            tool=row.tool,
            agent=row.agent,
            scope=row.scope,
            scope_id=row.scope_id,
            match=row.match or {},
            max_uses=row.max_uses,
            uses=row.uses,
            status=status_of(row),
            made_by=row.made_by,
            made_role=row.made_role,
            made_via=row.made_via,
            reason=row.reason,
            from_request=row.from_request,
            maker_groups=row.maker_groups,
            created_at=row.created_at,
            expires_at=row.expires_at,
            revoked_at=row.revoked_at,
            revoked_by=row.revoked_by,
        )
