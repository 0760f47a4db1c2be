"""The inbox's lists: the open requests (`/`) and the history of decided ones (`/history`).

Both are keyset pages of the store's listing (`store.query_requests`): an
honest total of everything the filters match, the oldest first by default
(the most urgent), and a link to the next page that stays right however many
requests arrive meanwhile. The filters ride the URL, so a filtered page can be
bookmarked, shared, and reloaded by `inbox.js` when something changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any, get_args
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from api._auth import Principal
from api._inbox import page_session, render
from api._inbox_views import item_of
from api._state import client_of
from relayq.agents import registered_agents
from store import BadQuery, Page, RequestQuery, StoredRequest
from store.answers import MAX_BULK
from store.paging import DEFAULT_PAGE
from store.paging import MAX_PAGE as STORE_MAX_PAGE
from store.requests import RequestSort, SortOrder, age_of

__all__ = ["AGES", "HISTORY", "MAX_PAGE", "PAGE", "PAGE_SIZES", "Filters", "router"]

PAGE = DEFAULT_PAGE
"""Requests on a page of the inbox, unless the user chooses another size."""
MAX_PAGE = 200
"""The most a page of the inbox shows: its rows are HTML, each with its forms. (The API
and `relayq pending` page up to `store.paging.MAX_PAGE`, 500.)"""
PAGE_SIZES = (PAGE, 100, MAX_PAGE)
"""The page sizes the filter form offers; the URL's `limit` takes any from 1 to MAX_PAGE."""

AGES: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "4h": timedelta(hours=4),
    "1d": timedelta(days=1),
    "7d": timedelta(days=7),
}
"""The age filter's choices: created at least this long ago."""

HISTORY = ("answered", "expired", "cancelled")
"""The statuses the history shows: every way a request stops waiting."""

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True, kw_only=True)
class Filters:
    """What a list shows: one set of filters, read from a URL or a form, written back to one."""

    agent: str = ""
    tool: str = ""
    group: str = ""
    q: str = ""
    """Text in the prompt or the arguments."""
    age: str = ""
    """Only requests at least that old: a key of AGES, or any age `store.age_of` reads
    (the API's `older_than`, which the inbox takes too)."""
    newer_than: str = ""
    """Only requests at most that old, read as the API's `newer_than`."""
    status: str = ""
    """The history's: one of HISTORY, or every one of them."""
    sort: str = "age"
    order: str = ""
    """`asc` or `desc`; empty for the list's own default (oldest first; history newest)."""
    limit: str = ""
    """Requests a page shows, 1 to MAX_PAGE; empty for PAGE."""

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> Filters:
        """The filters in a query string or a form; BadQuery for one the inbox does not take."""
        values = {name: str(given.get(name) or "").strip() for name in cls.__dataclass_fields__}
        older = str(given.get("older_than") or "").strip()
        filters = cls(**{**values, "sort": values["sort"] or "age", "age": values["age"] or older})
        for age, name in ((filters.age, "age"), (filters.newer_than, "newer_than")):
            if age:
                age_of(age, name)  # BadQuery for one no listing reads
        if filters.status and filters.status not in HISTORY:
            raise BadQuery(f"unknown status {filters.status!r}; one of {', '.join(HISTORY)}")
        if filters.sort not in get_args(RequestSort):
            raise BadQuery(f"unknown sort {filters.sort!r}; one of age, agent, tool", "sort")
        if filters.order and filters.order not in get_args(SortOrder):
            raise BadQuery(f"unknown order {filters.order!r}; asc or desc", "order")
        if filters.limit and not _size(filters.limit):
            raise BadQuery(
                f"a page of the inbox shows 1 to {MAX_PAGE} requests, not {filters.limit!r}; "
                f"walk the pages for more (the API pages up to {STORE_MAX_PAGE})",
                "limit",
            )
        return replace(filters, limit="") if filters.size == PAGE else filters

    @property
    def size(self) -> int:
        """Requests a page shows."""
        return _size(self.limit) or PAGE

    def query(
        self, *, history: bool, cursor: str | None = None, limit: int | None = None
    ) -> RequestQuery:
        statuses: str | tuple[str, ...] = "open"
        if history:
            statuses = self.status or HISTORY
        order: Any = self.order or ("desc" if history else "asc")
        return RequestQuery(
            status=statuses,
            agent=self.agent or None,
            tool=self.tool or None,
            group=self.group or None,
            search=self.q or None,
            sort=self.sort,  # type: ignore[arg-type]  # checked in `of`
            order=order,
            limit=limit or self.size,
            cursor=cursor,
        ).aged(
            age_of(self.age) if self.age else None,
            age_of(self.newer_than, "newer_than") if self.newer_than else None,
        )

    def params(self) -> dict[str, str]:
        """The filters that are set, for a URL or hidden form fields."""
        return {k: v for k, v in asdict(self).items() if v and not (k == "sort" and v == "age")}

    def url(self, path: str, **extra: str) -> str:
        query = urlencode({**self.params(), **{k: v for k, v in extra.items() if v}})
        return f"{path}?{query}" if query else path

    @property
    def active(self) -> bool:
        """Whether a filter narrows the list (a sort or a page size does not)."""
        return bool(replace(self, sort="age", order="", limit="").params())


def _size(text: str) -> int | None:
    """A page size given as text, if it is one the inbox shows."""
    if not (text.isascii() and text.isdigit()) or len(text) > 4:
        return None
    return int(text) if 1 <= int(text) <= MAX_PAGE else None


async def fetch_page(request: Request, query: RequestQuery) -> Page[StoredRequest]:
    client = client_of(request)
    return await client.query_requests(query)


async def _list(request: Request, *, history: bool) -> Response:
    who = page_session(request)
    if not isinstance(who, Principal):
        return who
    params = request.query_params
    try:
        filters = Filters.of(params)
        cursor = params.get("cursor") or None
        page = await fetch_page(request, filters.query(history=history, cursor=cursor))
    except BadQuery as exc:
        return render(
            request,
            who,
            "inbox.html",
            _context(Filters(), None, history),
            status=422,
            error=str(exc),
        )
    first = _int(params.get("from"), 1)
    return render(request, who, "inbox.html", _context(filters, page, history, first))


def _context(
    filters: Filters, page: Page[StoredRequest] | None, history: bool, first: int = 1
) -> dict[str, Any]:
    items = [item_of(s) for s in page.items] if page is not None else []
    path = "/history" if history else "/"
    after = page.next_cursor if page is not None else None
    return {
        "history": history,
        "filters": filters,
        "requests": items,
        "total": page.total if page is not None else 0,
        "first": first,
        "last": first + len(items) - 1,
        "next_url": filters.url(path, cursor=after, **{"from": str(first + len(items))})
        if after
        else None,
        "first_url": filters.url(path) if first > 1 else None,
        "agents": sorted(registered_agents()),
        "ages": list(AGES),
        "sizes": sorted({*PAGE_SIZES, filters.size}),
        "cap": MAX_BULK,
        "statuses": HISTORY,
    }


def _int(text: str | None, default: int) -> int:
    return int(text) if text and text.isascii() and text.isdigit() else default


@router.get("/", response_class=HTMLResponse)
async def inbox(request: Request) -> Response:
    """The open requests, oldest first: the login form until the browser holds a session."""
    return await _list(request, history=False)


@router.get("/history", response_class=HTMLResponse)
async def history(request: Request) -> Response:
    """Requests that no longer wait: answered, expired or cancelled, the newest first."""
    return await _list(request, history=True)
