"""The inbox's pages over real HTTP, real workers behind: lists, filters, a request's page,
edits, declines, history, a run's page, bulk decisions; the API's and the CLI's bulk too."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html import escape, unescape
from typing import Any

import pytest
from sqlmodel import col, select

from store.models import VoteRow, utcnow
from store.webhooks import Event
from tasks import DurableClient
from tasks.webhooks.sender import slack_text

from .conftest import ApiServer, Durable, Eventually, serve_api
from .desk import (
    DESK_TOKENS,
    FAY,
    GIL,
    SID,
    SUE,
    VAL,
    crowd,
    ids_of,
    inbox_session,
    new_tag,
    refund_prompt,
    start_refunds,
    waiting,
)
from .test_api import csrf_of, open_request, settled_run

ITEM = re.compile(r'<tr class="request[^"]*" id="request-[^"]+" data-request-id="([^"]+)"')
NEXT = re.compile(r'<a href="([^"]+)" rel="next">')


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable, DESK_TOKENS)


def listed(html: str) -> list[str]:
    return ITEM.findall(html)


def count_line(html: str) -> str:
    found = re.search(r'<p class="count">\s*(.*?)\s*</p>', html, re.S)
    assert found is not None, html[:2000]
    return " ".join(unescape(found.group(1)).split())


# --- sessions -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/history", "/requests/req_x", "/runs/run_x?start=0"])
async def test_a_page_without_a_session_is_the_login_form_which_comes_back_to_it(
    api: ApiServer, path: str
):
    async with api.http() as http:
        page = await http.get(path)
        assert page.status_code == 401
        assert 'name="token"' in page.text
        assert f'name="next" value="{escape(path)}"' in page.text
        login = {"token": VAL, "csrf_token": csrf_of(page.text), "next": path}
        res = await http.post("/login", data=login)
        assert res.status_code == 303
        assert res.headers["location"] == path

        http.cookies.set("relayq_token", "not-a-token")
        stale = await http.get(path)
    assert stale.status_code == 401
    assert "That token is not valid" in stale.text


# --- the list: honest counts, paging, filters ------------------------------------------


async def test_the_list_counts_everything_and_pages_past_200_oldest_first(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    # Given 230 refunds waiting (more than the old page of 200 showed)
    await start_refunds(durable, tag, 230)
    opened = await waiting(api, tag, 230, eventually)
    oldest_first = ids_of(opened)

    # When a viewer walks the inbox's pages, filtered to them
    async with inbox_session(api, VAL) as (http, _):
        page = await http.get("/", params={"q": tag})
        assert page.status_code == 200
        assert count_line(page.text) == "Showing 1–50 of 230 open requests matching the filters"
        seen = listed(page.text)
        while (link := NEXT.search(page.text)) is not None:
            page = await http.get(unescape(link.group(1)))
            seen += listed(page.text)
        last = count_line(page.text)

    # Then every request is on exactly one page, the oldest first, and the counts add up
    assert seen == oldest_first
    assert last == "Showing 201–230 of 230 open requests matching the filters"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({"agent": "desk"}, 3, id="agent"),
        pytest.param({"agent": "lookup"}, 0, id="another agent"),
        pytest.param({"tool": "refund"}, 3, id="tool"),
        pytest.param({"group": "finance"}, 3, id="group"),
        pytest.param({"group": "support"}, 0, id="another group"),
        pytest.param({"age": "1h"}, 0, id="older than an hour"),
        pytest.param({"older_than": "1h"}, 0, id="older_than, as the API takes it"),
        pytest.param({"newer_than": "1h"}, 3, id="newer_than, as the API takes it"),
        pytest.param({"tool": "", "agent": ""}, 3, id="an empty value is no filter"),
    ],
)
async def test_filters_narrow_the_list_and_its_count(
    api: ApiServer,
    durable: Durable,
    eventually: Eventually,
    params: dict[str, str],
    expected: int,
    tag: str,
):
    await start_refunds(durable, tag, 3)
    opened = await waiting(api, tag, 3, eventually)

    async with inbox_session(api, VAL) as (http, _):
        page = await http.get("/", params={"q": tag, **params})
        by_tool = await http.get("/", params={"q": tag, "sort": "tool", "order": "desc"})

    assert page.status_code == 200
    assert len(listed(page.text)) == expected
    if expected:
        assert count_line(page.text).startswith(f"Showing 1–{expected} of {expected} open")
    else:
        assert count_line(page.text) == "No request matches."
    assert listed(by_tool.text) == list(reversed(ids_of(opened)))


@pytest.mark.parametrize(
    "params",
    [
        {"age": "3 weeks"},
        {"older_than": "soon"},
        {"newer_than": "1y"},
        {"sort": "price"},
        {"order": "up"},
        {"cursor": "not-a-cursor"},
    ],
    ids=["age", "older_than", "newer_than", "sort", "order", "cursor"],
)
async def test_a_filter_the_inbox_does_not_take_is_a_clear_422(
    api: ApiServer, params: dict[str, str]
):
    async with inbox_session(api, VAL) as (http, _):
        page = await http.get("/", params=params)
    assert page.status_code == 422
    assert '<p class="error" role="alert">' in page.text
    assert listed(page.text) == []


# --- a request's page -------------------------------------------------------------------


def cell(html: str, name: str) -> str:
    found = re.search(rf'<tr data-argument="{name}"><th>{name}</th><td>(.*?)</td>', html, re.S)
    assert found is not None, f"no row for {name}"
    return unescape(found.group(1))


async def test_a_request_page_shows_what_a_decision_needs_and_the_edit_is_applied(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    # Given a refund of 110 waiting on finance
    (run_id,) = await start_refunds(durable, tag, 1, amount=110)
    (stored,) = await waiting(api, tag, 1, eventually)
    request_id = stored["request"]["id"]

    async with inbox_session(api, FAY) as (http, csrf):
        # When fay of finance opens its page
        page = await http.get(f"/requests/{request_id}")

        # Then it shows the arguments as a table, the raw JSON, the run's prompt, who
        # started it, and the forms to decide
        assert page.status_code == 200
        html = page.text
        assert (cell(html, "order"), cell(html, "amount"), cell(html, "note")) == (
            "00000",
            "110",
            tag,
        )
        assert "In euros" in html  # the schema's description
        assert '<details class="raw">' in html
        assert f"&#34;note&#34;: &#34;{tag}&#34;" in html
        assert re.search(r'<blockquote class="run-prompt">\{&#34;order', html)
        assert "<th>Started by</th><td>sue</td>" in html
        assert "0 of 1 approval" in html
        assert f'action="/requests/{request_id}/edit"' in html
        assert 'name="arg:amount" value="110"' in html
        assert '<details class="message' in html  # the transcript, folded

        # When an amount that is not a number is sent, nothing is decided
        bad = await http.post(
            f"/requests/{request_id}/edit",
            data={"csrf_token": csrf, "arg:order": "00000", "arg:amount": "lots", "arg:note": tag},
        )
        assert bad.status_code == 422
        assert "amount must be a number" in bad.text
        # ... nor for one the tool's schema refuses (maximum 1000)
        over = await http.post(
            f"/requests/{request_id}/edit",
            data={"csrf_token": csrf, "arg:order": "00000", "arg:amount": "5000", "arg:note": tag},
        )
        assert over.status_code == 422, over.text

        # When she approves it with the amount edited to 55
        done = await http.post(
            f"/requests/{request_id}/edit",
            data={"csrf_token": csrf, "arg:order": "00000", "arg:amount": "55", "arg:note": tag},
        )
        assert done.status_code == 303
        confirmed = await http.get(done.headers["location"])
        assert f"Approved {request_id} with the edited arguments." in confirmed.text

    # Then the tool ran once, with 55, and the model was told what changed
    run = await settled_run(api, run_id, eventually, token=VAL)
    assert run["text"] == (
        "[The approver changed the arguments before refund ran: amount: 110 -> 55]\n"
        "refunded 55 on order 00000"
    )
    assert durable.count("tool", f"desk {run_id} 55") == 1
    assert durable.count("tool", f"desk {run_id} 110") == 0

    # And the page now shows the outcome and the decision, with its diff, read-only
    async with inbox_session(api, VAL) as (http, _):
        after = (await http.get(f"/requests/{request_id}")).text
        history = (await http.get("/history", params={"q": tag})).text
    assert re.search(
        r"<strong>edited</strong> by fay at [-0-9: ]+UTC \(amount: 110 → 55\)", history
    )
    assert re.search(r"<td>fay <span", after)
    assert "<code>amount</code>: 110 → 55" in after
    assert f'action="/requests/{request_id}/approve"' not in after
    async with api.http(VAL) as viewer:
        trail = (await viewer.get(f"/api/requests/{request_id}/decisions")).json()
    assert [(d["actor"], d["via"], d["outcome"], d["diff"]) for d in trail] == [
        ("fay", "inbox", "edited", {"amount": [110, 55]})
    ]


async def test_a_request_page_names_the_batch_and_job_its_run_belongs_to(
    api: ApiServer, eventually: Eventually, tag: str
):
    # Given a refund started over the API as job 17 of a batch
    body = {"agent": "desk", "prompt": refund_prompt(tag, 0), "batchId": "b-nov", "jobId": "17"}
    async with api.http(SUE) as sue:
        res = await sue.post("/api/runs", json=body)
        refused = await sue.post("/api/runs", json={**body, "jobId": ""})
    assert res.status_code == 201, res.text
    assert refused.status_code == 422
    (stored,) = await waiting(api, tag, 1, eventually)

    # Then its request's page and its run's page say so
    async with inbox_session(api, VAL) as (http, _):
        page = (await http.get(f"/requests/{stored['request']['id']}")).text
        run = (await http.get(f"/runs/{res.json()['id']}")).text
    shown = "<tr><th>Batch</th><td><code>b-nov</code>, job <code>17</code></td></tr>"
    assert shown in page
    assert shown in run


async def test_outside_its_groups_a_request_is_read_only_and_a_post_is_refused(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    await start_refunds(durable, tag, 1)
    (stored,) = await waiting(api, tag, 1, eventually)
    request_id = stored["request"]["id"]

    async with inbox_session(api, SID) as (http, csrf):  # sid is in support, not finance
        page = await http.get(f"/requests/{request_id}")
        listing = await http.get("/", params={"q": tag})
        post = await http.post(f"/requests/{request_id}/approve", data={"csrf_token": csrf})

    assert page.status_code == 200
    assert "Only members of finance may decide this request" in page.text
    assert f'action="/requests/{request_id}/approve"' not in page.text
    assert "read-only: for finance" in listing.text
    assert post.status_code == 403
    assert "not in the approver groups" in post.text
    async with api.http(VAL) as viewer:
        assert (await viewer.get(f"/api/requests/{request_id}")).json()["status"] == "open"


async def test_a_decline_needs_a_reason_and_the_model_is_told_it(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    (run_id,) = await start_refunds(durable, tag, 1)
    (stored,) = await waiting(api, tag, 1, eventually)
    request_id = stored["request"]["id"]

    async with inbox_session(api, GIL) as (http, csrf):
        empty = await http.post(
            f"/requests/{request_id}/decline", data={"csrf_token": csrf, "reason": "  "}
        )
        declined = await http.post(
            f"/requests/{request_id}/decline",
            data={"csrf_token": csrf, "reason": "paid twice", "next": "/history"},
        )

    assert empty.status_code == 422
    assert "declining takes a reason" in empty.text
    assert declined.status_code == 303
    assert declined.headers["location"] == "/history"
    run = await settled_run(api, run_id, eventually, token=VAL)
    assert "paid twice" in run["text"]
    assert durable.count("tool", f"desk {run_id} 10") == 0


async def test_a_next_location_outside_the_inbox_is_not_followed(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    await start_refunds(durable, tag, 1)
    (stored,) = await waiting(api, tag, 1, eventually)
    request_id = stored["request"]["id"]
    async with inbox_session(api, GIL) as (http, csrf):
        res = await http.post(
            f"/requests/{request_id}/approve",
            data={"csrf_token": csrf, "next": "//evil.example/phish"},
        )
    assert res.status_code == 303
    assert res.headers["location"] == "/"


# --- history and runs ---------------------------------------------------------------


async def test_history_shows_who_decided_what_and_when_and_a_run_page_its_story(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    # Given two refunds: one approved by fay, one declined by gil
    first, second = await start_refunds(durable, tag, 2)
    opened = await waiting(api, tag, 2, eventually)
    # Two requests opened in the same instant list in either order: pair them by run
    by_run = {item["runId"]: item["request"]["id"] for item in opened}
    approved, declined = by_run[first], by_run[second]
    async with inbox_session(api, FAY) as (http, csrf):
        await http.post(f"/requests/{approved}/approve", data={"csrf_token": csrf})
    async with inbox_session(api, GIL) as (http, csrf):
        data = {"csrf_token": csrf, "reason": "not ours"}
        await http.post(f"/requests/{declined}/decline", data=data)
    await settled_run(api, first, eventually, token=VAL)
    await settled_run(api, second, eventually, token=VAL)

    async with inbox_session(api, VAL) as (http, _):
        history = await http.get("/history", params={"q": tag})
        only_declined = await http.get("/history", params={"q": tag, "status": "answered"})
        open_now = await http.get("/", params={"q": tag})
        run_page = await http.get(f"/runs/{first}")

    # Then the history lists both, newest first, with who, when and what
    assert listed(history.text) == list(reversed(ids_of(opened)))
    assert count_line(history.text) == "Showing 1–2 of 2 decided requests matching the filters"
    outcomes = re.findall(r'<p class="outcome">(.*?)</p>', history.text, re.S)
    text = [" ".join(unescape(re.sub(r"<[^>]+>", "", o)).split()) for o in outcomes]
    outcome = dict(zip(listed(history.text), text, strict=True))
    assert re.fullmatch(r"declined by gil at [-0-9: ]+UTC: not ours", outcome[declined])
    assert outcome[approved].startswith("approved by fay at ")
    assert len(listed(only_declined.text)) == 2  # both were answered; neither expired
    assert listed(open_now.text) == []

    # And the run's page shows its status, requests, decisions and transcript
    assert run_page.status_code == 200
    assert 'class="badge status-done">done' in run_page.text
    assert f'href="/requests/{approved}"' in run_page.text
    assert "refunded 10 on order 00000" in run_page.text
    assert re.search(r"<td>fay <span", run_page.text)
    assert "Messages 1–4 of 4." in run_page.text


async def test_an_unknown_request_or_run_is_a_404_page(api: ApiServer):
    async with inbox_session(api, VAL) as (http, _):
        request = await http.get("/requests/req_nope")
        run = await http.get("/runs/run_nope")
    assert (request.status_code, run.status_code) == (404, 404)
    assert "req_nope" in request.text
    assert "run_nope" in run.text


# --- many at once -------------------------------------------------------------------

PREVIEW_ITEMS = re.compile(r'name="items" value="([^"]*)"')


async def test_bulk_approve_previews_then_refuses_it_whole_when_one_changed_meanwhile(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    # Given three refunds waiting on finance (the oldest request first; the runs' turns
    # may open them in another order than the runs were started in)
    await start_refunds(durable, tag, 3)
    opened = await waiting(api, tag, 3, eventually)
    ids, runs = ids_of(opened), [item["runId"] for item in opened]

    async with inbox_session(api, FAY) as (http, csrf):
        # When fay selects all three and asks to approve them
        form = {"csrf_token": csrf, "action": "approve-selected", "q": tag, "ids": ids}
        preview = await http.post("/bulk/preview", data=form)

        # Then a preview lists them, and nothing is decided yet
        assert preview.status_code == 200, preview.text
        assert "Approve 3 requests?" in preview.text
        items = unescape(PREVIEW_ITEMS.search(preview.text).group(1))  # type: ignore[union-attr]
        assert sorted(i.rpartition(":")[0] for i in items.split(",")) == sorted(ids)

        # When gil declines one of them before she confirms
        async with api.http(GIL) as gil:
            stale = ids[1]
            body = {"decision": "decline", "reason": "duplicate"}
            res = await gil.post(f"/api/requests/{stale}/decision", json=body)
            assert res.status_code == 200, res.text
        confirm = {"csrf_token": csrf, "decision": "approve", "items": items, "q": tag}
        refused = await http.post("/bulk", data=confirm)

        # Then nothing is applied, and the page says which request refused and why
        assert refused.status_code == 409, refused.text
        assert "Nothing was decided: 1 of 3 requests" in refused.text
        assert f'<tr data-request-id="{stale}" class="refused">' in refused.text
        async with api.http(VAL) as viewer:
            for request_id in (ids[0], ids[2]):
                stored = (await viewer.get(f"/api/requests/{request_id}")).json()
                assert stored["status"] == "open", stored

        # When she confirms the others, as the page offers
        others = unescape(PREVIEW_ITEMS.search(refused.text).group(1))  # type: ignore[union-attr]
        assert stale not in others
        done = await http.post("/bulk", data={**confirm, "items": others})
        assert done.status_code == 303
        assert done.headers["location"] == f"/?q={tag}"
        shown = await http.get(done.headers["location"])
        assert "Approved 2 requests." in shown.text

    # Then those two runs refund, and the declined one does not
    for run_id in (runs[0], runs[2]):
        run = await settled_run(api, run_id, eventually, token=VAL)
        assert run["text"].startswith("refunded"), run["text"]
    declined = await settled_run(api, runs[1], eventually, token=VAL)
    assert "duplicate" in declined["text"]


async def test_bulk_decline_of_all_matching_needs_a_reason_and_decides_every_match(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    runs = await start_refunds(durable, tag, 60)  # more than a page
    await waiting(api, tag, 60, eventually)

    async with inbox_session(api, GIL) as (http, csrf):
        form = {"csrf_token": csrf, "action": "decline-matching", "q": tag}
        preview = await http.post("/bulk/preview", data=form)
        assert preview.status_code == 200
        assert "Decline 60 requests?" in preview.text
        items = unescape(PREVIEW_ITEMS.search(preview.text).group(1))  # type: ignore[union-attr]
        assert len(items.split(",")) == 60

        confirm = {"csrf_token": csrf, "decision": "decline", "items": items, "q": tag}
        no_reason = await http.post("/bulk", data=confirm)
        assert no_reason.status_code == 422
        assert "Declining takes a reason" in no_reason.text

        done = await http.post("/bulk", data={**confirm, "reason": "campaign ended"})
        assert done.status_code == 303, done.text

    for run_id in runs:
        run = await settled_run(api, run_id, eventually, token=VAL)
        assert "campaign ended" in run["text"]
    async with api.http(VAL) as viewer:
        audit = (await viewer.get("/api/audit", params={"actor": "gil", "limit": 500})).json()
    mine = [d for d in audit["items"] if d["runId"] in runs]
    assert {(d["outcome"], d["via"], d["reason"]) for d in mine} == {
        ("declined", "inbox", "campaign ended")
    }
    assert len(mine) == 60


async def test_bulk_preview_without_a_selection_says_so(api: ApiServer):
    async with inbox_session(api, FAY) as (http, csrf):
        res = await http.post(
            "/bulk/preview", data={"csrf_token": csrf, "action": "approve-selected"}
        )
    assert res.status_code == 422
    assert "Select the requests to decide first" in res.text


def words(html: str) -> str:
    """A page's text as one line, its markup's spacing and entities gone."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def previewed(html: str) -> list[str]:
    """The ids a preview's confirmation would decide, in its order."""
    found = PREVIEW_ITEMS.search(html)
    assert found is not None, words(html)[:2000]
    return [item.rpartition(":")[0] for item in unescape(found.group(1)).split(",")]


async def test_over_the_cap_the_inbox_offers_the_oldest_1000_matching_and_decides_exactly_those(
    api: ApiServer, durable: Durable
):
    # Given 1,050 refund approvals waiting (two approvals each), after 5 older relay requests
    tag = new_tag()
    with crowd(durable, tag, 1050, relay=5) as ids:
        relays, approvals = ids[:5], ids[5:]
        async with inbox_session(api, FAY) as (http, csrf):
            # When fay lists them, the list offers the oldest 1,000, not all 1,055
            # (listed the newest first: "the oldest" still means the oldest)
            listing = words((await http.get("/", params={"q": tag, "order": "desc"})).text)
            assert "Approve the oldest 1,000 matching…" in listing
            assert "Decline the oldest 1,000 matching…" in listing
            assert "all 1,055 matching" not in listing

            # When she asks to approve them: the preview says it approves the oldest
            # 1,000 of the 1,050 approvals, and that it left the relay requests out
            form = {"csrf_token": csrf, "action": "approve-matching", "q": tag, "order": "desc"}
            preview = await http.post("/bulk/preview", data=form)
            assert preview.status_code == 200, words(preview.text)[:2000]
            shown = words(preview.text)
            assert "Approve the oldest 1,000 of 1,050 matching requests?" in shown
            assert "left out 5 relay requests: they take an answer, not a decision" in shown
            assert "Approve 0" not in shown
            assert previewed(preview.text) == approvals[:1000]
            assert "Approve 1,000" in shown

            # And declining would decline the oldest 1,000 of all 1,055, relay ones too
            decline = {**form, "action": "decline-matching"}
            declining = await http.post("/bulk/preview", data=decline)
            assert "Decline the oldest 1,000 of 1,055 matching requests?" in words(declining.text)
            assert previewed(declining.text) == ids[:1000]

            # When she confirms the approval
            items = unescape(PREVIEW_ITEMS.search(preview.text).group(1))  # type: ignore[union-attr]
            confirm = {"csrf_token": csrf, "decision": "approve", "items": items, "q": tag}
            done = await http.post("/bulk", data=confirm)
            assert done.status_code == 303, words(done.text)[:2000]
            after = words((await http.get(done.headers["location"])).text)
            assert "Approved 1,000 requests (0 resolved" in after

        # Then exactly those 1,000 have her vote: not the 50 youngest, nor a relay request
        db = durable.db()
        try:
            with db.read() as s:
                mine = select(VoteRow.request_id).where(
                    VoteRow.voter == "fay", col(VoteRow.request_id).in_(ids)
                )
                voted = set(s.exec(mine))
        finally:
            db.dispose()
        assert voted == set(approvals[:1000])
        assert not voted & set(relays)


async def test_the_list_takes_a_page_size_up_to_200_and_keeps_it_in_its_links(
    api: ApiServer, durable: Durable
):
    tag = new_tag()
    with crowd(durable, tag, 250) as ids:
        async with inbox_session(api, FAY) as (http, _):
            default = await http.get("/", params={"q": tag})
            page = await http.get("/", params={"q": tag, "limit": "200"})
            link = NEXT.search(page.text)
            assert link is not None
            rest = await http.get(unescape(link.group(1)))
            too_many = await http.get("/", params={"q": tag, "limit": "500"})
            not_a_size = await http.get("/", params={"q": tag, "limit": "lots"})

    assert len(listed(default.text)) == 50
    assert listed(page.text) == ids[:200]
    assert count_line(page.text) == "Showing 1–200 of 250 open requests matching the filters"
    assert "limit=200" in unescape(link.group(1))
    assert listed(rest.text) == ids[200:]
    assert count_line(rest.text) == "Showing 201–250 of 250 open requests matching the filters"
    # the filter form and the bulk form keep the size too
    assert '<option value="200" selected>' in page.text
    assert '<input type="hidden" name="limit" value="200">' in page.text
    for refused in (too_many, not_a_size):
        assert refused.status_code == 422
        assert "a page of the inbox shows 1 to 200 requests" in unescape(refused.text)
        assert listed(refused.text) == []


# --- the same over the API ------------------------------------------------------------


async def test_the_api_decides_many_at_once_or_none_naming_each_refusal(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    await start_refunds(durable, tag, 3)
    listed_items = await waiting(api, tag, 3, eventually)
    runs = [item["runId"] for item in listed_items]
    seen = [{"id": s["request"]["id"], "revision": s["revision"]} for s in listed_items]

    async with api.http(GIL) as gil, api.http(SID) as sid:
        # sid is not in finance: refused whole, each request named
        outsider = await sid.post(
            "/api/requests/decisions", json={"decision": "approve", "requests": seen}
        )
        assert outsider.status_code == 409, outsider.text
        assert {r["id"] for r in outsider.json()["refused"]} == {s["id"] for s in seen}
        assert "not in the approver groups" in outsider.json()["refused"][0]["why"]

        # a request decided since its listing is refused, and nothing else is decided
        first = seen[0]["id"]
        await gil.post(f"/api/requests/{first}/decision", json={"decision": "approve"})
        stale = await gil.post(
            "/api/requests/decisions", json={"decision": "approve", "requests": seen}
        )
        assert stale.status_code == 409
        assert [r["id"] for r in stale.json()["refused"]] == [first]

        # bodies that are not one decision are 422
        for bad in (
            {"decision": "decline", "requests": seen[1:]},
            {"decision": "approve", "requests": []},
            {"decision": "approve", "requests": seen[1:2] * 2},
            {"decision": "edit", "requests": seen[1:]},
        ):
            assert (await gil.post("/api/requests/decisions", json=bad)).status_code == 422, bad

        done = await gil.post(
            "/api/requests/decisions", json={"decision": "approve", "requests": seen[1:]}
        )
        assert done.status_code == 200, done.text
        assert sorted(done.json()["decided"]) == sorted(s["id"] for s in seen[1:])
        assert sorted(done.json()["resumed"]) == sorted(runs[1:])

    for run_id in runs:
        assert (await settled_run(api, run_id, eventually, token=VAL))["text"].startswith(
            "refunded"
        )


async def waiting_lookup(api: ApiServer, eventually: Eventually, prompt: str) -> dict[str, Any]:
    """The open request of a `lookup` run sue starts: a relay tool's, no approval."""
    async with api.http(SUE) as sue:
        res = await sue.post("/api/runs", json={"agent": "lookup", "prompt": prompt})
    assert res.status_code == 201, res.text
    return await open_request(api, res.json()["id"], eventually, token=VAL)


async def test_the_api_refuses_to_approve_a_relay_request_in_bulk(
    api: ApiServer, eventually: Eventually, prompt: str
):
    stored = await waiting_lookup(api, eventually, prompt)
    async with api.http(GIL) as gil:
        body = {"decision": "approve", "requests": [{"id": stored["request"]["id"]}]}
        res = await gil.post("/api/requests/decisions", json=body)
        assert res.status_code == 409
        assert "is not an approval" in res.json()["refused"][0]["why"]
        answer = {"output": "done"}  # leave nothing open behind
        assert (
            await gil.post(f"/api/requests/{stored['request']['id']}/answer", json=answer)
        ).status_code == 200


async def test_the_inbox_refuses_an_edit_of_a_relay_request_and_keeps_nothing(
    api: ApiServer, eventually: Eventually, prompt: str
):
    # Given a run waiting on a relay tool's call
    stored = await waiting_lookup(api, eventually, prompt)
    run_id = stored["runId"]
    request_id = stored["request"]["id"]

    # When gil posts the edit form for it (a decision, which only an approval takes)
    async with inbox_session(api, GIL) as (http, csrf):
        edited = await http.post(
            f"/requests/{request_id}/edit", data={"csrf_token": csrf, "arg:q": "x"}
        )

        # Then the request's page comes back with a 409 saying why, and it stays open
        assert edited.status_code == 409, edited.text
        assert "is a tool_call request, not an approval" in edited.text
        async with api.http(VAL) as viewer:
            after = (await viewer.get(f"/api/requests/{request_id}")).json()
        assert (after["status"], after["revision"]) == ("open", stored["revision"])
        # ... to be answered with its result, which the model gets
        answered = await http.post(
            f"/requests/{request_id}/approve", data={"csrf_token": csrf, "output": "done"}
        )
        assert answered.status_code == 303
    assert (await settled_run(api, run_id, eventually, token=VAL))["text"] == "done"


async def test_a_slack_messages_link_opens_the_requests_page_in_the_inbox(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    await start_refunds(durable, tag, 1)
    (stored,) = await waiting(api, tag, 1, eventually)
    request_id = stored["request"]["id"]
    event = Event(
        id="evt_x",
        type="request.opened",
        run_id=stored["runId"],
        request_id=request_id,
        payload={"tool": "refund", "agent": "desk"},
        created_at=utcnow(),
    )
    link = re.search(r"<([^|>]+)\|open request>", slack_text(event, api.url))
    assert link is not None

    async with inbox_session(api, FAY) as (http, _):
        page = await http.get(link.group(1))
    assert page.status_code == 200
    assert f'data-request-id="{request_id}" data-status="open"' in page.text


EVIL = '<script>alert(1)</script>" onmouseover="alert(2)" x="'


async def test_every_page_escapes_what_the_model_and_the_prompt_wrote(
    api: ApiServer, durable: Durable, eventually: Eventually, tag: str
):
    # Given a refund whose prompt, arguments and transcript all carry markup
    async with DurableClient(settings=durable.settings) as client:
        prompt = json.dumps({"order": EVIL, "amount": 5, "note": f"{tag} {EVIL}"})
        run_id = await client.start("desk", prompt, started_by=EVIL)
    (stored,) = await waiting(api, tag, 1, eventually)
    request_id = stored["request"]["id"]

    # When every page that shows it is rendered
    async with inbox_session(api, FAY) as (http, csrf):
        pages = [
            (await http.get("/", params={"q": tag})).text,
            (await http.get(f"/requests/{request_id}")).text,
            (await http.get(f"/runs/{run_id}")).text,
        ]
        form = {"csrf_token": csrf, "action": "approve-selected", "ids": request_id, "q": tag}
        pages.append((await http.post("/bulk/preview", data=form)).text)
        await http.post(
            f"/requests/{request_id}/decline", data={"csrf_token": csrf, "reason": EVIL}
        )
        await settled_run(api, run_id, eventually, token=VAL)
        pages.append((await http.get("/history", params={"q": tag})).text)
        pages.append((await http.get(f"/requests/{request_id}")).text)

    # Then no markup of theirs survives anywhere, and every quote stays an entity
    for html in pages:
        assert "<script>alert" not in html
        assert 'onmouseover="' not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
