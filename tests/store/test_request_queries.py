"""Listing requests: filters, search, sorts, keyset pages and honest totals, on both databases."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, insert
from sqlmodel import col

from store import (
    BadQuery,
    Database,
    Page,
    RequestQuery,
    StoredRequest,
    all_requests,
    list_requests,
    query_requests,
)
from store.models import RequestRow
from store.requests import age_of

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


_REQUEST = RequestRow(id="", run_id="", agent="support", kind="tool_call", prompt="").model_dump()
"""A request's columns, defaults and all, built once (tests.seeding)."""


def request_row(n: int, **columns: Any) -> dict[str, Any]:
    """A stored request's columns: open, made `n` seconds after T0, unless told otherwise."""
    values: dict[str, Any] = {
        "id": f"req_{n:05d}",
        "run_id": f"run_{n:05d}",
        "prompt": f"request number {n}",
        "created_at": T0 + timedelta(seconds=n),
    }
    return _REQUEST | values | columns


def add(db: Database, rows: Iterable[dict[str, Any]]) -> None:
    """One bulk insert: thousands of rows in one statement, not one turn each."""
    with db.write() as s:
        s.execute(insert(RequestRow.__table__), list(rows))  # type: ignore[attr-defined]


def ids(items: Iterable[StoredRequest]) -> list[str]:
    return [s.request.id for s in items]


def walk(db: Database, query: RequestQuery, between: Callable[[int], None] | None = None) -> list:
    """Every page of `query`, following the cursors; `between(n)` runs after page n."""
    pages = [query_requests(db, query)]
    while pages[-1].next_cursor is not None:
        if between is not None:
            between(len(pages))
        pages.append(query_requests(db, replace(query, cursor=pages[-1].next_cursor)))
    return pages


# --- the default listing ----------------------------------------------------------


def test_the_first_page_holds_the_oldest_open_requests_and_counts_every_open_one(db: Database):
    # Given 234 open requests, inserted in no particular order, and a few closed older ones
    numbers = list(range(10, 244))
    random.Random(7).shuffle(numbers)
    add(db, [request_row(n) for n in numbers])
    add(db, [request_row(n, status="answered") for n in range(10)])

    # When the default listing is asked for
    page = query_requests(db)

    # Then it shows the 50 oldest open ones, oldest first, says 234, and how to go on
    assert ids(page) == [f"req_{n:05d}" for n in range(10, 60)]
    assert page.total == 234
    assert page.next_cursor is not None


def test_a_page_reads_like_the_list_it_replaces(db: Database):
    add(db, [request_row(1, tool="lookup", approvers=["finance"])])

    page = query_requests(db)
    [only] = page

    assert isinstance(page, Page)
    assert (len(page), page[0], page[:1], page == [only], bool(page)) == (
        1, only, [only], True, True
    )  # fmt: skip
    assert (only.tool, only.approvers, only.agent) == ("lookup", ["finance"], "support")
    assert query_requests(db, RequestQuery(agent="nobody")) == []
    assert not query_requests(db, RequestQuery(agent="nobody"))


def test_list_requests_still_gives_the_newest_first_and_more_than_a_page(db: Database):
    add(db, [request_row(n) for n in range(600)])

    listed = list_requests(db, limit=1000)

    assert ids(listed) == [f"req_{n:05d}" for n in reversed(range(600))]
    assert ids(list_requests(db, limit=3)) == ["req_00599", "req_00598", "req_00597"]


# --- paging -------------------------------------------------------------------------


def mixed_rows(count: int) -> list[dict[str, Any]]:
    """Rows whose agents, tools and times repeat, so every sort has ties to break."""
    agents, tools = ["bravo", "alpha", "charlie"], [None, "xray", "yankee", "zulu"]
    return [
        request_row(
            n,
            agent=agents[n % 3],
            tool=tools[n % 4],
            created_at=T0 + timedelta(seconds=n // 5),  # five requests a second
        )
        for n in range(count)
    ]


def expected_order(rows: list[dict[str, Any]], sort: str, order: str) -> list[str]:
    keys = {
        "age": lambda r: (r["created_at"], r["id"]),
        "agent": lambda r: (r["agent"], r["created_at"], r["id"]),
        "tool": lambda r: (r["tool"] or "", r["created_at"], r["id"]),
    }
    return [r["id"] for r in sorted(rows, key=keys[sort], reverse=order == "desc")]


@pytest.mark.parametrize("order", ["asc", "desc"])
@pytest.mark.parametrize("sort", ["age", "agent", "tool"])
def test_paging_through_each_sort_sees_every_request_once_in_order(
    db: Database, sort: str, order: str
):
    rows = mixed_rows(61)
    add(db, rows)

    pages = walk(db, RequestQuery(sort=sort, order=order, limit=7))  # type: ignore[arg-type]

    seen = [i for page in pages for i in ids(page)]
    assert seen == expected_order(rows, sort, order)
    assert [len(p) for p in pages] == [7] * 8 + [5]
    assert {p.total for p in pages} == {61}
    assert pages[-1].next_cursor is None


def test_a_last_page_that_is_exactly_full_has_no_next_cursor(db: Database):
    add(db, [request_row(n) for n in range(20)])

    pages = walk(db, RequestQuery(limit=10))

    assert [len(p) for p in pages] == [10, 10]
    assert pages[-1].next_cursor is None


def test_requests_opened_between_pages_come_later_and_none_is_seen_twice_or_skipped(
    db: Database,
):
    # Given 30 open requests
    add(db, [request_row(n) for n in range(30)])

    # When 5 newer ones open, and 3 already listed are answered, after each of two pages
    def meanwhile(after_page: int) -> None:
        if after_page > 2:
            return
        base = 100 + 10 * after_page
        add(db, [request_row(base + k) for k in range(5)])
        with db.write() as s:
            for n in range(3):
                row = s.get(RequestRow, f"req_{(after_page - 1) * 10 + n:05d}")
                assert row is not None
                row.status = "answered"

    pages = walk(db, RequestQuery(limit=10), between=meanwhile)

    # Then each of the first 30 is seen once, in order, and the newer ones after them
    seen = [i for page in pages for i in ids(page)]
    assert len(seen) == len(set(seen))
    assert seen[:30] == [f"req_{n:05d}" for n in range(30)]
    assert seen[30:] == sorted(seen[30:])
    assert pages[0].total == 30
    assert seen[30:] == [f"req_{n:05d}" for n in (*range(110, 115), *range(120, 125))]
    assert pages[1].total == 30 + 5 - 3, "the total is counted afresh on each page"


def test_a_newest_first_walk_is_not_disturbed_by_newer_requests(db: Database):
    add(db, [request_row(n) for n in range(25)])

    pages = walk(
        db,
        RequestQuery(order="desc", limit=10),
        between=lambda page: add(db, [request_row(1000 + page)]),
    )

    seen = [i for page in pages for i in ids(page)]
    assert seen == [f"req_{n:05d}" for n in reversed(range(25))]


def test_all_requests_walks_every_page_from_a_cursor_on(db: Database):
    add(db, [request_row(n) for n in range(1200)])

    every = all_requests(db, RequestQuery())
    first = query_requests(db, RequestQuery(limit=100))
    rest = all_requests(db, RequestQuery(cursor=first.next_cursor))

    assert ids(every) == [f"req_{n:05d}" for n in range(1200)]
    assert (every.total, every.next_cursor) == (1200, None)
    assert ids(first) + ids(rest) == ids(every)


def test_ten_thousand_open_requests_page_through_each_once_in_order(db: Database):
    # Given 10,000 open requests, a hundred a second, and a few closed ones
    rows = [
        request_row(n, created_at=T0 + timedelta(milliseconds=10 * n), agent=f"agent{n % 7}")
        for n in range(10_000)
    ]
    random.Random(11).shuffle(rows)
    add(db, rows)
    add(db, [request_row(20_000 + n, status="expired") for n in range(50)])

    # When every page of the open ones is read, oldest first
    pages = walk(db, RequestQuery(limit=500))

    # Then each is seen exactly once, in order, and every page says 10,000
    seen = [i for page in pages for i in ids(page)]
    assert seen == [f"req_{n:05d}" for n in range(10_000)]
    assert len(pages) == 20
    assert {p.total for p in pages} == {10_000}


# --- filters --------------------------------------------------------------------------


def listed(db: Database, **filters: Any) -> list[str]:
    return sorted(ids(query_requests(db, RequestQuery(limit=500, **filters))))


def test_status_picks_one_several_or_every_status(db: Database):
    statuses = ["open", "answered", "expired", "cancelled"]
    add(db, [request_row(n, status=statuses[n % 4]) for n in range(8)])

    assert listed(db) == ["req_00000", "req_00004"]
    assert listed(db, status="expired") == ["req_00002", "req_00006"]
    assert listed(db, status=["open", "cancelled"]) == [
        "req_00000", "req_00003", "req_00004", "req_00007"
    ]  # fmt: skip
    assert len(listed(db, status=None)) == 8
    assert query_requests(db, RequestQuery(status=("answered", "expired"))).total == 4


def test_agent_tool_kind_and_run_pick_exactly_their_requests(db: Database):
    add(
        db,
        [
            request_row(1, agent="billing", tool="refund"),
            request_row(2, agent="billing", tool="lookup", kind="approval"),
            request_row(3, agent="support", tool="refund", kind="approval", run_id="run_x"),
            request_row(4, agent="billing_x", tool=None),
        ],
    )

    assert listed(db, agent="billing") == ["req_00001", "req_00002"]
    assert listed(db, tool="refund") == ["req_00001", "req_00003"]
    assert listed(db, kind="approval") == ["req_00002", "req_00003"]
    assert listed(db, run_id="run_x") == ["req_00003"]
    assert listed(db, agent="billing", tool="refund") == ["req_00001"]
    assert listed(db, agent="bill%") == []


APPROVERS: list[list[str] | None] = [
    ["finance"],
    ["ops", "finance"],
    ["devops"],
    [],
    None,
    ["fin%"],
    ["a_b"],
    ['say "hi"'],
    ["équipe"],
]


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ("finance", [0, 1]),
        ("ops", [1]),
        ("devops", [2]),
        ("fin", []),
        ("fin%", [5]),
        ("a_b", [6]),
        ("axb", []),
        ('say "hi"', [7]),
        ("équipe", [8]),
        ("", list(range(len(APPROVERS)))),  # an empty filter is none, as everywhere
    ],
)
def test_group_picks_the_requests_whose_approvers_name_it_exactly(
    db: Database, group: str, expected: list[int]
):
    add(db, [request_row(n, approvers=a) for n, a in enumerate(APPROVERS)])

    assert listed(db, group=group) == [f"req_{n:05d}" for n in expected]


def test_created_after_and_before_make_a_half_open_window(db: Database):
    add(db, [request_row(n) for n in range(10)])
    at = [T0 + timedelta(seconds=n) for n in range(10)]

    assert listed(db, created_after=at[7]) == ["req_00007", "req_00008", "req_00009"]
    assert listed(db, created_before=at[2]) == ["req_00000", "req_00001"]
    assert listed(db, created_after=at[3], created_before=at[5]) == ["req_00003", "req_00004"]
    elsewhere = at[3].astimezone(datetime.now().astimezone().tzinfo)
    assert listed(db, created_after=elsewhere, created_before=at[4]) == ["req_00003"]


SEARCHED = [
    request_row(0, prompt="Refund order 17?"),
    request_row(1, kind="approval", data={"tool": "pay", "arguments": {"amount": "100%"}}),
    request_row(2, kind="approval", data={"tool": "pay", "arguments": {"amount": "1000"}}),
    request_row(
        3,
        calls=[{"id": "c1", "name": "lookup", "input": {"city": "Paris"}, "arguments": "{}"}],
    ),
    request_row(4, prompt="rename a_c.txt"),
    request_row(5, prompt="rename abc.txt"),
    request_row(6, kind="approval", data={"arguments": {"note": 'she said "yes"'}}),
    request_row(7, kind="approval", data={"arguments": {"place": "Café Zoë"}}),
    request_row(8, prompt="path a/b and 50\\50"),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("refund ORDER", [0], id="prompt, any case"),
        pytest.param("100%", [1], id="percent is a character"),
        pytest.param("%", [1], id="a lone percent"),
        pytest.param("a_c", [4], id="underscore is a character"),
        pytest.param("_", [4], id="a lone underscore"),
        pytest.param("paris", [3], id="a relay call's arguments"),
        pytest.param("1000", [2], id="an approval's arguments"),
        pytest.param('"yes"', [6], id="quotes inside arguments"),
        pytest.param("Café Zoë", [7], id="non-ASCII inside arguments"),
        pytest.param("a/b", [8], id="the escape character"),
        pytest.param("50\\50", [8], id="a backslash"),
        pytest.param("nothing like it", [], id="no match"),
    ],
)
def test_search_finds_text_in_the_prompt_or_the_arguments_with_wildcards_taken_literally(
    db: Database, text: str, expected: list[int]
):
    add(db, SEARCHED)

    found = query_requests(db, RequestQuery(search=text))

    assert sorted(ids(found)) == [f"req_{n:05d}" for n in expected]
    assert found.total == len(expected)


def test_filters_combine_and_the_total_counts_only_what_they_pick(db: Database):
    add(db, [request_row(n, agent=["a", "b"][n % 2], prompt=f"p{n % 3}") for n in range(90)])

    page = query_requests(db, RequestQuery(agent="a", search="p0", limit=5))

    assert page.total == 15  # n even and n % 3 == 0: 0, 6, ..., 84
    assert ids(page) == [f"req_{n:05d}" for n in (0, 6, 12, 18, 24)]


# --- refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field", "says"),
    [
        (RequestQuery(status="sleeping"), "status", "unknown status 'sleeping'"),
        (RequestQuery(status=["open", "done"]), "status", "unknown status 'done'"),
        (RequestQuery(sort="size"), "sort", "unknown sort 'size'"),  # type: ignore[arg-type]
        (RequestQuery(order="up"), "order", "unknown order 'up'"),  # type: ignore[arg-type]
        (RequestQuery(limit=0), "limit", "limit must be 1 to 500 (got 0)"),
        (RequestQuery(limit=501), "limit", "limit must be 1 to 500 (got 501)"),
        (
            RequestQuery(created_before=datetime(2025, 1, 1)),
            "created_before",
            "created_before needs a time zone",
        ),
        (RequestQuery(cursor="not a cursor!"), "cursor", "bad cursor"),
        (RequestQuery(cursor="x" * 5000), "cursor", "bad cursor: it is too long"),
    ],
)
def test_a_bad_filter_sort_limit_or_cursor_is_refused_saying_which(
    db: Database, query: RequestQuery, field: str, says: str
):
    with pytest.raises(BadQuery) as refused:
        query_requests(db, query)
    assert refused.value.field == field
    assert says in str(refused.value)


def test_a_cursor_cut_edited_or_made_for_another_sort_is_refused(db: Database):
    add(db, mixed_rows(30))
    cursor = query_requests(db, RequestQuery(limit=5)).next_cursor
    agent_cursor = query_requests(db, RequestQuery(sort="agent", limit=5)).next_cursor
    assert cursor is not None
    assert agent_cursor is not None
    middle = len(cursor) // 2
    edited = cursor[:middle] + ("A" if cursor[middle] != "A" else "B") + cursor[middle + 1 :]

    for bad, sort, order in [
        (cursor[:-6], "age", "asc"),
        (edited, "age", "asc"),
        (cursor, "age", "desc"),
        (cursor, "agent", "asc"),
        (agent_cursor, "age", "asc"),
    ]:
        with pytest.raises(BadQuery, match="bad cursor"):
            query_requests(db, RequestQuery(cursor=bad, sort=sort, order=order))  # type: ignore[arg-type]
    assert len(query_requests(db, RequestQuery(cursor=cursor, limit=5))) == 5


# --- for the API's and the CLI's listing tests ------------------------------------


@contextmanager
def seeded_requests(db: Database, rows: list[dict[str, Any]]) -> Iterator[list[str]]:
    """`rows` written straight to a shared store for one test, and removed after it."""
    request_ids = [r["id"] for r in rows]
    add(db, rows)
    try:
        yield request_ids
    finally:
        with db.write() as s:
            s.execute(delete(RequestRow).where(col(RequestRow.id).in_(request_ids)))


def listing_rows(tag: str, agent: str) -> list[dict[str, Any]]:
    """60 open requests of `agent`, a second apart, with tools, groups, kinds, runs and
    prompts that vary, then 5 answered ones; ids `req_<tag>_<n>`."""
    prompts = {7: "rate is 100% today", 8: "rate is 1000 today"}
    return [
        request_row(
            n,
            id=f"req_{tag}_{n:03d}",
            run_id=f"run_{tag}_{n // 10}",
            agent=agent,
            tool=["refund", "lookup", None][n % 3],
            approvers=["finance"] if n % 5 == 0 else None,
            kind="approval" if n % 4 == 0 else "tool_call",
            prompt=prompts.get(n, f"request number {n}"),
            status="open" if n < 60 else "answered",
            applied=n >= 60,
        )
        for n in range(65)
    ]


def test_a_cursor_carries_the_filters_of_the_page_that_printed_it(db: Database):
    # Given declined (answered) and open requests of two agents, interleaved
    add(
        db,
        [
            request_row(n, status=("answered", "open")[n % 2], agent=("a", "b")[n // 2 % 2])
            for n in range(40)
        ],
    )
    first = query_requests(db, RequestQuery(status="answered", agent="a", limit=3))
    assert first.next_cursor is not None

    # When the next page is asked for with the cursor alone (the defaults: open, any agent)
    rest = all_requests(db, RequestQuery(cursor=first.next_cursor))

    # Then it is the same listing: answered requests of agent a, after the first page's
    expected = [f"req_{n:05d}" for n in range(40) if n % 2 == 0 and n // 2 % 2 == 0]
    assert ids(first.items) + ids(rest.items) == expected
    assert rest.total == len(expected)


def test_an_empty_filter_value_is_no_filter(db: Database):
    add(db, [request_row(n, tool=("t", None)[n % 2]) for n in range(4)])
    everything = listed(db)
    for name in ("agent", "tool", "kind", "group", "run_id", "search", "cursor"):
        assert listed(db, **{name: ""}) == everything, name
    assert listed(db, status="") == listed(db, status=()) == everything  # open, the default


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("15m", 900), (" 2h ", 7200), ("3d", 259200), ("1w", 604800)]
)
def test_an_age_reads_one_way_for_every_listing(text: str, seconds: int):
    assert age_of(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["soon", "", "2", "h", "1y", "1.5h", "9" * 12 + "s"])
def test_an_age_that_is_none_is_refused_naming_the_filter(text: str):
    with pytest.raises(BadQuery, match=r"cannot read .* as an age") as refused:
        age_of(text, "newer_than")
    assert refused.value.field == "newer_than"


def test_an_age_narrows_the_creation_bounds_a_query_has_and_never_widens_them():
    now = T0 + timedelta(days=10)
    hour, day = timedelta(hours=1), timedelta(days=1)

    # An age alone sets its bound
    alone = RequestQuery().aged(older_than=hour, newer_than=day, now=now)
    assert (alone.created_before, alone.created_after) == (now - hour, now - day)
    # ... beside a tighter bound, the bound stays; beside a looser one, the age wins
    tight = RequestQuery(created_before=now - day, created_after=now - hour)
    assert tight.aged(hour, day, now=now) == tight
    loose = RequestQuery(created_before=now, created_after=now - 3 * day)
    narrowed = loose.aged(hour, day, now=now)
    assert (narrowed.created_before, narrowed.created_after) == (now - hour, now - day)
    # ... and no age changes nothing
    assert loose.aged(now=now) == loose


@pytest.mark.parametrize("text", ["36501d", "99999999d", "999999999w", "999999999h"])
def test_an_age_past_a_century_is_refused_where_it_is_given(text: str):
    assert age_of("36500d") == timedelta(days=36500)
    with pytest.raises(BadQuery, match="over a century") as refused:
        age_of(text, "older_than")
    assert refused.value.field == "older_than"
