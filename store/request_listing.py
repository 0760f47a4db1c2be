"""Listing requests: `RequestQuery`'s filters and sorts, and its keyset pages, whose
cursors carry the filters of the page that printed them (`query_requests`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ConfigDict
from sqlalchemy import ColumnElement, String, Table, cast, exists, func, literal, or_, tuple_
from sqlalchemy import select as sa_select
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import select
from sqlmodel.sql.expression import SelectOfScalar

from relayq.wire import CamelModel
from store.db import Database
from store.models import RequestRow
from store.paging import DEFAULT_PAGE, MAX_PAGE, BadQuery, Page, decode_cursor, encode_cursor
from store.request_terms import STATUSES, RequestSort, SortOrder
from store.stored_requests import StoredRequest, stored_requests

__all__ = [
    "RequestPage",
    "RequestQuery",
    "all_requests",
    "list_requests",
    "query_requests",
]


_REQUESTS: Table = RequestRow.__table__  # type: ignore[attr-defined]
_C = _REQUESTS.c

# A sort's key: its own column, then age and id, so no two rows tie and a
# cursor names one place. Every part follows the one order: `desc` is
# exactly `asc` reversed, and "after the cursor" is one row-value comparison,
# `(created_at, id) > (:t, :id)`, which both databases can answer from an index.
_SORT_KEYS: dict[str, tuple[str, ...]] = {
    "age": ("created_at", "id"),
    "agent": ("agent", "created_at", "id"),
    "tool": ("tool", "created_at", "id"),
}
_KEY_COLUMNS: dict[str, ColumnElement[Any]] = {
    "created_at": _C.created_at,
    "id": _C.id,
    "agent": _C.agent,
    # No tool sorts as "", first: NULLs would order differently on each database.
    "tool": func.coalesce(_C.tool, ""),
}
_EQUAL_TO: dict[str, ColumnElement[Any]] = {n: _C[n] for n in ("agent", "tool", "kind", "run_id")}


@dataclass(frozen=True, kw_only=True)
class RequestQuery:
    """Which requests to list, in which order, and which page of them.

    RequestQuery(status="open", group="finance", search="refund", sort="agent")
    """

    status: str | Sequence[str] | None = "open"
    """A status (open, answered, expired, cancelled), several, or None for every one."""
    agent: str | None = None
    tool: str | None = None
    """The tool a request is about: an approval's tool, a relay request's first call's."""
    kind: str | None = None
    group: str | None = None
    """Only requests whose approver groups name this one (not those open to anyone)."""
    run_id: str | None = None
    search: str | None = None
    """Text in the prompt or the arguments, any case; `%` and `_` match only themselves.
    (SQLite folds the case of ASCII letters only.)"""
    created_after: datetime | None = None
    """Created at or after this moment (an aware datetime)."""
    created_before: datetime | None = None
    """Created before this moment (an aware datetime)."""
    sort: RequestSort = "age"
    """`age` (oldest first: the most urgent), `agent` or `tool`; ties go by age, then id."""
    order: SortOrder = "asc"
    """`asc`, or `desc` for the exact reverse."""
    limit: int = DEFAULT_PAGE
    """Items on a page: 1 to 500."""
    cursor: str | None = None
    """The `next_cursor` of the page before, for the page after it."""

    def aged(
        self,
        older_than: timedelta | None = None,
        newer_than: timedelta | None = None,
        *,
        now: datetime | None = None,
    ) -> RequestQuery:
        """This query narrowed to the requests at least `older_than` old and at most
        `newer_than` old (`age_of` reads `2h`), within whatever creation bounds it has."""
        now = now or datetime.now(UTC)
        before, after = self.created_before, self.created_after
        if older_than is not None:
            older = now - older_than
            before = older if before is None else min(before, older)
        if newer_than is not None:
            newer = now - newer_than
            after = newer if after is None else max(after, newer)
        return replace(self, created_before=before, created_after=after)


class RequestPage(CamelModel):
    """A page of requests as the HTTP API and `relayq pending --json` show it."""

    model_config = ConfigDict(frozen=True)

    items: list[StoredRequest]
    total: int
    """Every request that matches the filters, on every page."""
    next_cursor: str | None = None
    """The `cursor` of the next page; null on the last."""

    @classmethod
    def of(cls, page: Page[StoredRequest]) -> RequestPage:
        return cls(items=list(page.items), total=page.total, next_cursor=page.next_cursor)


def query_requests(db: Database, query: RequestQuery | None = None) -> Page[StoredRequest]:
    """A page of the requests `query` picks (the oldest open ones by default), with the
    total of all that match and the cursor to the next page. BadQuery for a filter,
    sort, page size or cursor the store does not take.

    Every caller (the CLI, the API, the inbox, `DurableClient.requests`) comes through
    here, so all share its defaults: open requests, and an empty filter value is no
    filter. A cursor carries the filters of the page that printed it: the next page
    is of that listing, whatever filters come with the cursor."""
    query = _without_empty(query or RequestQuery())
    key: list[Any] | None = None
    if query.cursor is not None:
        key, query = _carried(query, query.cursor)
    _check(query)
    where = _where(query, sqlite=db.is_sqlite)
    listing = _ordered(select(RequestRow).where(*where), query.sort, query.order)
    if key is not None:
        listing = listing.where(_after(query, key))
    with db.snapshot() as s:  # the page, its holds and its total from one moment
        rows = list(s.exec(listing.limit(query.limit + 1)))  # one more: is there a next page?
        total = s.exec(select(func.count()).select_from(RequestRow).where(*where)).one()
        more, rows = len(rows) > query.limit, rows[: query.limit]
        items = stored_requests(s, rows)
    after = None
    if more:
        after = encode_cursor(
            [*_key_of(rows[-1], query.sort), _filters_of(query)], scope=_scope(query)
        )
    return Page(items=items, total=total, next_cursor=after)


_FILTERS = ("agent", "tool", "kind", "group", "run_id", "search")
_MOMENTS = ("created_after", "created_before")


def _without_empty(query: RequestQuery) -> RequestQuery:
    """`?tool=` filters on nothing, here as in the inbox: an empty value is no filter."""

    def given(value: str | None) -> str | None:
        return None if value == "" else value

    status = query.status
    if status == "" or (status is not None and not isinstance(status, str) and not status):
        status = "open"
    return replace(
        query,
        status=status,
        agent=given(query.agent),
        tool=given(query.tool),
        kind=given(query.kind),
        group=given(query.group),
        run_id=given(query.run_id),
        search=given(query.search),
        cursor=given(query.cursor),
    )


def _filters_of(query: RequestQuery) -> dict[str, Any]:
    """The filters a cursor carries, as JSON."""
    statuses = (
        query.status
        if query.status is None or isinstance(query.status, str)
        else list(query.status)
    )
    moments = {name: getattr(query, name) for name in _MOMENTS}
    return {
        "status": statuses,
        **{name: getattr(query, name) for name in _FILTERS},
        **{name: None if m is None else m.isoformat() for name, m in moments.items()},
    }


def _carried(query: RequestQuery, cursor: str) -> tuple[list[Any], RequestQuery]:
    """The cursor's key, and `query` with the filters the cursor carries."""
    *key, filters = decode_cursor(cursor, scope=_scope(query), size=len(_SORT_KEYS[query.sort]) + 1)
    try:
        if not isinstance(filters, dict) or set(filters) != {"status", *_FILTERS, *_MOMENTS}:
            raise ValueError(filters)
        after, before = (
            None if filters[name] is None else _moment(str(filters[name])) for name in _MOMENTS
        )
        status = filters["status"]
        texts = {name: filters[name] for name in _FILTERS}
        if not all(v is None or isinstance(v, str) for v in texts.values()):
            raise ValueError(texts)
        carried = replace(
            query,
            status=status if status is None or isinstance(status, str) else tuple(status),
            agent=texts["agent"],
            tool=texts["tool"],
            kind=texts["kind"],
            group=texts["group"],
            run_id=texts["run_id"],
            search=texts["search"],
            created_after=after,
            created_before=before,
        )
    except (ValueError, TypeError):
        raise BadQuery("bad cursor: its filters are not a listing's", "cursor") from None
    return _key_values(query, key), carried


def all_requests(db: Database, query: RequestQuery | None = None) -> Page[StoredRequest]:
    """Every page of `query` from its cursor on, as one page; its total is the last page's."""
    step = replace(query or RequestQuery(), limit=MAX_PAGE)
    items: list[StoredRequest] = []
    while True:
        page = query_requests(db, step)
        items.extend(page.items)
        if page.next_cursor is None:
            return Page(items=items, total=page.total)
        step = replace(step, cursor=page.next_cursor)


def list_requests(
    db: Database,
    *,
    status: str | None = "open",
    run_id: str | None = None,
    agent: str | None = None,
    kind: str | None = None,
    limit: int = 100,
) -> list[StoredRequest]:
    """Requests, newest first, as many as `limit` (no page cap): for the store's own
    callers. Hosts and operators page with `query_requests`."""
    query = RequestQuery(status=status, run_id=run_id, agent=agent, kind=kind)
    _check(query)
    listing = _ordered(select(RequestRow).where(*_where(query, sqlite=db.is_sqlite)), "age", "desc")
    with db.read() as s:
        return stored_requests(s, list(s.exec(listing.limit(limit))))


def _statuses(status: str | Sequence[str] | None) -> tuple[str, ...]:
    """The statuses asked for; () for every one."""
    if status is None:
        return ()
    return (status,) if isinstance(status, str) else tuple(status)


def _check(query: RequestQuery) -> None:
    unknown = [s for s in _statuses(query.status) if s not in STATUSES]
    if unknown:
        raise BadQuery(f"unknown status {unknown[0]!r}; one of {', '.join(STATUSES)}", "status")
    if query.sort not in _SORT_KEYS:
        raise BadQuery(f"unknown sort {query.sort!r}; one of {', '.join(_SORT_KEYS)}", "sort")
    if query.order not in ("asc", "desc"):
        raise BadQuery(f"unknown order {query.order!r}; asc or desc", "order")
    if not 1 <= query.limit <= MAX_PAGE:
        raise BadQuery(f"limit must be 1 to {MAX_PAGE} (got {query.limit})", "limit")
    for name in ("created_after", "created_before"):
        moment: datetime | None = getattr(query, name)
        if moment is not None and moment.utcoffset() is None:
            raise BadQuery(f"{name} needs a time zone (e.g. 2025-05-01T12:00:00Z)", name)


def _where(query: RequestQuery, *, sqlite: bool) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    statuses = _statuses(query.status)
    if statuses:
        where.append(_C.status.in_(statuses))
    for name, column in _EQUAL_TO.items():
        value = getattr(query, name)
        if value is not None:
            where.append(column == value)
    if query.group is not None:
        where.append(_in_group(query.group, sqlite=sqlite))
    if query.search:
        where.append(_mentions(query.search))
    if query.created_after is not None:
        where.append(_C.created_at >= query.created_after)
    if query.created_before is not None:
        where.append(_C.created_at < query.created_before)
    return where


def _in_group(group: str, *, sqlite: bool) -> ColumnElement[bool]:
    """`approvers` (a JSON list) holds `group`: an element test, not a text match, so
    `ops` is not found in `devops` and no character of the name is special."""
    if sqlite:
        element = func.json_each(_C.approvers).table_valued("value")
        return exists(sa_select(1).select_from(element).where(element.c.value == group))
    holds: ColumnElement[bool] = cast(_C.approvers, JSONB).has_key(group)
    return holds


def _mentions(text: str) -> ColumnElement[bool]:
    """`text` in the prompt, or in the arguments' JSON (`data`, `calls`), any case.

    The JSON columns keep text as `json.dumps` wrote it (quotes and non-ASCII
    escaped), so the text is looked for there as it would be written too.
    autoescape: the user's `%` and `_` are characters, not wildcards.
    """
    spelled = json.dumps(text)[1:-1]
    found = [_C.prompt.icontains(text, autoescape=True)]
    for column in (_C.data, _C.calls):
        as_text = cast(column, String)
        found += [as_text.icontains(needle, autoescape=True) for needle in {text, spelled}]
    return or_(*found)


def _ordered(
    listing: SelectOfScalar[RequestRow], sort: str, order: str
) -> SelectOfScalar[RequestRow]:
    keys = [_KEY_COLUMNS[name] for name in _SORT_KEYS[sort]]
    return listing.order_by(*(k.desc() if order == "desc" else k.asc() for k in keys))


def _after(query: RequestQuery, key: list[Any]) -> ColumnElement[bool]:
    """Rows past the cursor's key, in the listing's order: one row-value comparison."""
    keys = [_KEY_COLUMNS[name] for name in _SORT_KEYS[query.sort]]
    # Typed literals: the time goes through the column's own type (naive UTC on SQLite).
    given = tuple_(*(literal(value, k.type) for k, value in zip(keys, key, strict=True)))
    return tuple_(*keys) < given if query.order == "desc" else tuple_(*keys) > given


def _scope(query: RequestQuery) -> str:
    return f"{query.sort}:{query.order}"


def _key_of(row: RequestRow, sort: str) -> list[Any]:
    values = {
        "created_at": row.created_at.isoformat(),
        "id": row.id,
        "agent": row.agent,
        "tool": row.tool or "",
    }
    return [values[name] for name in _SORT_KEYS[sort]]


def _key_values(query: RequestQuery, key: list[Any]) -> list[Any]:
    names = _SORT_KEYS[query.sort]
    try:
        if not all(isinstance(value, str) for value in key):
            raise ValueError(key)
        return [
            _moment(value) if name == "created_at" else value
            for name, value in zip(names, key, strict=True)
        ]
    except ValueError:
        raise BadQuery("bad cursor: its key is not one of this sort", "cursor") from None


def _moment(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    if moment.utcoffset() is None:
        raise ValueError(text)
    return moment
