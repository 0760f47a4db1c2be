"""The back office in a real browser: refunds that fay and gil (finance) decide, sue started.

Paging past 200, filters, a request's page, an edited amount, a decline, a quorum
of two in two browsers, a bulk approval with one request refused, the history.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from playwright.async_api import Browser, expect

from ..conftest import SQLITE_ONLY, ApiServer, Durable, Eventually
from ..desk import FAY, GIL, SID, refund_prompt, start_refunds
from ..test_api import settled_run
from .conftest import LOOP, Shoot
from .pages import (
    button,
    fact,
    flash,
    logged_in,
    matching,
    open_ids,
    opened,
    posted,
    request_json,
    showing,
)

pytestmark = [pytest.mark.browser, LOOP, SQLITE_ONLY]
START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first


@pytest.mark.timeout(180)  # 230 real runs on the session's worker of two, twice, beside five lanes
async def test_the_list_pages_past_200_oldest_first_and_declines_all_that_match(
    api: ApiServer, browser: Browser, durable: Durable, eventually: Eventually, tag: str
):
    # Given 230 refunds waiting on finance
    await start_refunds(durable, tag, 230)
    oldest_first = await opened(api, tag, 230, eventually)

    # When fay searches for them and follows the "Next page" links to the end
    page = await logged_in(browser, api, FAY)
    await page.goto(f"/?q={tag}")
    seen: list[str] = []
    for first in range(1, 231, 50):
        last = min(first + 49, 230)
        seen += await showing(
            page, f"Showing {first}–{last} of 230 open requests matching the filters"
        )
        if last < 230:
            await page.get_by_role("link", name="Next page »").click()

    # Then every refund was on exactly one page, the oldest first, and the last has no next
    assert seen == oldest_first
    await expect(page.locator("a[rel=next]")).to_have_count(0)
    await expect(page.get_by_role("link", name="« First page")).to_be_visible()

    # When she declines all that match, from the last page
    await button(page, "Decline all 230 matching…").click()

    # Then the preview counts all 230 and lists the first 200, deciding nothing yet
    await expect(page.get_by_role("heading", name="Decline 230 requests?")).to_be_visible()
    await expect(page.locator("table.preview tr[data-request-id]")).to_have_count(200)
    await expect(page.get_by_text("… and 30 more.")).to_be_visible()
    assert len(await open_ids(api, tag)) == 230

    # When she confirms it with a reason, then all 230 are declined
    await page.get_by_label("reason").fill("refunded by bank transfer")
    await button(page, "Decline 230").click()
    await expect(flash(page)).to_have_text("Declined 230 requests.")
    await expect(page.locator("p.count")).to_have_text(matching(0))
    assert await open_ids(api, tag) == []


async def test_filters_and_sorts_change_the_list_and_its_count_and_a_bad_one_is_a_422(
    api: ApiServer,
    browser: Browser,
    durable: Durable,
    eventually: Eventually,
    tag: str,
    screenshot: Shoot,
):
    # Given two refunds that need two approvals, then three (younger) that need one
    await start_refunds(durable, tag, 2, agent="desk_pair")
    await opened(api, tag, 2, eventually)
    await start_refunds(durable, tag, 3)
    ids = await opened(api, tag, 5, eventually)
    pairs, singles = ids[:2], ids[2:]

    # When fay searches for them in the filter form
    page = await logged_in(browser, api, FAY)
    await page.get_by_label("Search").fill(tag)
    await button(page, "Filter").click()

    # Then the list shows the five, the oldest first
    assert await showing(page, matching(5)) == ids
    await screenshot(page, "inbox-list")

    # When she narrows it to an agent, the list and its count follow
    await page.get_by_label("Agent", exact=True).fill("desk_pair")
    await button(page, "Filter").click()
    assert await showing(page, matching(2)) == pairs
    await expect(page.locator("tr.request").filter(has_text="quorum 2")).to_have_count(2)

    # When she sorts by agent instead, descending, they all come back in that order
    await page.get_by_label("Agent", exact=True).fill("")
    await page.locator("select[name=sort]").select_option("agent")
    await page.locator("select[name=order]").select_option("desc")
    await button(page, "Filter").click()
    await page.wait_for_url(re.compile(r"sort=agent&order=desc"))
    assert await showing(page, matching(5)) == (singles + pairs)[::-1]

    # And each filter of the URL, alone or with others, narrows the list to what it names
    cases: list[tuple[dict[str, str], list[str]]] = [
        ({"sort": "agent"}, singles + pairs),
        ({"order": "desc"}, ids[::-1]),
        ({"agent": "desk", "tool": "refund", "group": "finance"}, singles),
        ({"tool": "refund", "group": "finance", "sort": "tool", "order": "desc"}, ids[::-1]),
        ({"tool": "lookup"}, []),
        ({"group": "support"}, []),
        ({"age": "1h"}, []),  # none is an hour old
        ({"agent": "desk_pair", "age": "1h"}, []),
    ]
    for params, expected in cases:
        await page.goto("/?" + urlencode({"q": tag, **params}))
        assert await showing(page, matching(len(expected))) == expected, params
    await page.goto("/?" + urlencode({"q": f"{tag}-nothing"}))
    assert await showing(page, matching(0)) == []

    # When a filter the inbox does not take is asked for, the page says what is wrong: a 422
    response = await page.goto(f"/?q={tag}&age=bogus")
    assert response is not None
    assert response.status == 422
    await expect(page.get_by_role("alert")).to_have_text(
        "cannot read 'bogus' as an age; write a number and a unit: 90s, 15m, 2h, 3d, 1w"
    )
    await expect(page.locator("tr.request")).to_have_count(0)


async def test_a_request_page_shows_the_arguments_the_raw_json_the_prompt_and_who_started_it(
    api: ApiServer,
    browser: Browser,
    durable: Durable,
    eventually: Eventually,
    tag: str,
    screenshot: Shoot,
):
    # Given a refund of 120 waiting on finance, started by sue
    (run_id,) = await start_refunds(durable, tag, 1, amount=120)
    (request_id,) = await opened(api, tag, 1, eventually)

    # When fay opens it from the list
    page = await logged_in(browser, api, FAY)
    await page.goto(f"/?q={tag}")
    await page.locator(f"#request-{request_id}").get_by_role("link", name="Open request").click()
    await expect(page).to_have_url(f"{api.url}/requests/{request_id}")

    # Then it shows the arguments as a table, with the schema's descriptions
    await expect(page.get_by_role("heading", name="Approve refund?")).to_be_visible()
    table = page.locator("table.arguments-table")
    for name, value in (("order", "00000"), ("amount", "120"), ("note", tag)):
        await expect(table.locator(f'tr[data-argument="{name}"] td').first).to_have_text(value)
    await expect(table.locator('tr[data-argument="amount"] td.meta')).to_have_text("In euros")

    # And the raw JSON, one click away
    raw = page.locator("details.raw pre")
    await expect(raw).to_be_hidden()
    await page.locator("details.raw").get_by_text("Raw JSON").click()
    await expect(raw).to_be_visible()
    await expect(raw).to_contain_text(f'"note": "{tag}"')
    await expect(raw).to_contain_text('"amount": 120')

    # And the run's prompt, who started it, the approvals it takes, the transcript so far
    await expect(page.locator("blockquote.run-prompt")).to_have_text(refund_prompt(tag, 0, 120))
    await expect(fact(page, "Started by")).to_have_text("sue")
    await expect(fact(page, "Run")).to_contain_text(run_id)
    await expect(fact(page, "Approvers")).to_have_text("finance")
    await expect(fact(page, "Quorum")).to_have_text("0 of 1 approval")
    await expect(page.locator("details.message")).not_to_have_count(0)
    await expect(button(page, "Approve")).to_be_visible()
    await screenshot(page, "inbox-request")

    # When sid, of support, opens it, then he sees it read-only
    sid = await logged_in(browser, api, SID)
    await sid.goto(f"/requests/{request_id}")
    await expect(sid.locator("p.read-only")).to_have_text(
        "Only members of finance may decide this request; you see it read-only."
    )
    await expect(sid.locator("section.decide")).to_have_count(0)
    await expect(button(sid, "Approve")).to_have_count(0)


async def test_an_approval_with_an_edited_amount_refunds_that_amount_and_keeps_the_diff(
    api: ApiServer, browser: Browser, durable: Durable, eventually: Eventually, tag: str
):
    # Given a refund of 120 waiting on finance
    (run_id,) = await start_refunds(durable, tag, 1, amount=120)
    (request_id,) = await opened(api, tag, 1, eventually)

    # When fay edits the amount to 45.5 on its page and approves that
    page = await logged_in(browser, api, FAY)
    await page.goto(f"/requests/{request_id}")
    edit = page.locator("details.edit")
    await edit.get_by_text("Approve with edited arguments").click()
    amount = edit.locator('input[name="arg:amount"]')
    await expect(amount).to_have_value("120")
    await amount.fill("45.5")
    await button(edit, "Approve edited").click()

    # Then the inbox confirms it, and the run refunds 45.5, its model told what was changed
    await expect(flash(page)).to_have_text(f"Approved {request_id} with the edited arguments.")
    run = await settled_run(api, run_id, eventually)
    assert run["text"].endswith("refunded 45.5 on order 00000"), run["text"]
    assert "amount: 120 -> 45.5" in run["text"]
    assert durable.count("tool", f"desk {run_id} 45.5") == 1
    assert durable.count("tool", f"desk {run_id} 120") == 0

    # And the request's page shows the outcome, and fay's decision with its diff
    await page.goto(f"/requests/{request_id}")
    await expect(page.locator("h2 .badge")).to_have_text("edited")
    decision = page.locator("table.decisions tbody tr")
    await expect(decision).to_have_count(1)
    cells = decision.locator("td")
    await expect(cells.nth(1)).to_contain_text("fay")
    await expect(cells.nth(2)).to_have_text("inbox")
    await expect(cells.nth(3)).to_have_text("edited")
    await expect(cells.nth(4).locator(".diff")).to_have_text("amount: 120 → 45.5")
    await expect(page.locator("section.decide")).to_have_count(0)


async def test_a_decline_needs_a_reason_and_the_model_is_told_it(
    api: ApiServer, browser: Browser, durable: Durable, eventually: Eventually, tag: str
):
    (run_id,) = await start_refunds(durable, tag, 1)
    (request_id,) = await opened(api, tag, 1, eventually)
    page = await logged_in(browser, api, GIL)
    await page.goto(f"/requests/{request_id}")
    form = page.locator("form.decline")

    # When gil declines without a reason, the browser holds the form back
    await button(form, "Decline").click()
    assert await form.get_by_label("reason").evaluate("field => field.validity.valueMissing")
    # ... and one of blanks only, the inbox refuses, deciding nothing
    await form.get_by_label("reason").fill("   ")
    refused = await posted(page, button(form, "Decline"), f"/requests/{request_id}/decline")
    assert refused.status == 422
    await expect(page.get_by_role("alert")).to_have_text(
        "declining takes a reason; nothing was decided"
    )
    assert (await request_json(api, request_id))["status"] == "open"

    # When he gives a reason
    await form.get_by_label("reason").fill("paid twice")
    await button(form, "Decline").click()

    # Then the refund is declined: it never runs, and the model is told why
    await expect(flash(page)).to_have_text(f"Declined {request_id}.")
    run = await settled_run(api, run_id, eventually)
    assert run["text"] == "declined: paid twice"
    assert durable.count("tool", f"desk {run_id} 10") == 0


async def test_two_approvers_in_two_browsers_make_a_quorum_of_two(
    api: ApiServer,
    browser: Browser,
    durable: Durable,
    eventually: Eventually,
    tag: str,
    screenshot: Shoot,
):
    # Given a refund that takes two approvals
    (run_id,) = await start_refunds(durable, tag, 1, agent="desk_pair")
    (request_id,) = await opened(api, tag, 1, eventually)
    path = f"/requests/{request_id}"

    # When fay approves it in her browser
    fay = await logged_in(browser, api, FAY)
    await fay.goto(path)
    await expect(fact(fay, "Quorum")).to_have_text("0 of 2 approvals")
    await button(fay, "Approve").click()

    # Then her vote is recorded, and the request stays open, one approval short
    await expect(flash(fay)).to_have_text(f"Your vote on {request_id} (quorum 2) is recorded.")
    await fay.goto(path)
    await expect(fact(fay, "Quorum")).to_have_text("1 of 2 approvals")
    await expect(fay.locator("h2 .badge")).to_have_text("open")
    await expect(fay.locator("ul.votes li")).to_have_text(re.compile(r"^fay approved at "))
    await expect(fay.locator("p.read-only")).to_contain_text("You voted (approve) at ")
    await expect(button(fay, "Approve")).to_have_count(0)
    assert (await request_json(api, request_id))["status"] == "open"
    assert durable.count("tool", f"desk {run_id} 10") == 0

    # When gil opens it in his browser, he sees her vote, and approves too
    gil = await logged_in(browser, api, GIL)
    await gil.goto(path)
    await expect(fact(gil, "Quorum")).to_have_text("1 of 2 approvals")
    await expect(gil.locator("ul.votes")).to_contain_text("fay approved at ")
    await screenshot(gil, "inbox-quorum")
    await button(gil, "Approve").click()

    # Then the request is approved, and the refund runs, once
    await expect(flash(gil)).to_have_text(f"Approved {request_id}.")
    run = await settled_run(api, run_id, eventually)
    assert run["text"] == "refunded 10 on order 00000"
    assert durable.count("tool", f"desk {run_id} 10") == 1
    await gil.goto(path)
    await expect(gil.locator("h2 .badge")).to_have_text("approved")
    await expect(fact(gil, "Quorum")).to_have_text("2 of 2 approvals")
    await expect(gil.locator("ul.votes li")).to_have_count(2)


async def test_a_bulk_approval_with_one_request_decided_meanwhile_decides_none_then_the_others(
    api: ApiServer,
    browser: Browser,
    durable: Durable,
    eventually: Eventually,
    tag: str,
    screenshot: Shoot,
):
    # Given three refunds waiting on finance
    runs = await start_refunds(durable, tag, 3)
    ids = await opened(api, tag, 3, eventually)
    first, stale, last = ids

    # When fay selects the three on her list and asks to approve them
    page = await logged_in(browser, api, FAY)
    await page.goto(f"/?q={tag}")
    for request_id in ids:
        await page.get_by_label(f"select {request_id}").check()
    await button(page, "Approve selected…").click()

    # Then a preview lists them, and nothing is decided yet
    await expect(page.get_by_role("heading", name="Approve 3 requests?")).to_be_visible()
    await expect(page.locator("table.preview tr[data-request-id]")).to_have_count(3)
    assert await open_ids(api, tag) == ids

    # When gil approves one of them meanwhile, over the API, and then fay confirms
    async with api.http(GIL) as gil:
        res = await gil.post(f"/api/requests/{stale}/decision", json={"decision": "approve"})
        assert res.status_code == 200, res.text
    refused = await posted(page, button(page, "Approve 3"), "/bulk")

    # Then nothing is decided: the page names the one decided meanwhile; the others wait
    assert refused.status == 409
    await expect(page.get_by_role("alert")).to_contain_text(
        "Nothing was decided: 1 of 3 requests cannot take this decision now"
    )
    await expect(page.locator("tr.refused")).to_have_count(1)
    await expect(page.locator("tr.refused")).to_have_attribute("data-request-id", stale)
    await expect(page.locator("ul.refused-list li")).to_have_count(1)
    await expect(page.locator("ul.refused-list li")).to_contain_text(stale)
    assert await open_ids(api, tag) == [first, last]
    await screenshot(page, "inbox-bulk-refused")

    # When she confirms the two others
    await button(page, "Approve 2 others").click()

    # Then they are approved by her, and the three refunds run
    await expect(flash(page)).to_have_text("Approved 2 requests.")
    assert await open_ids(api, tag) == []
    for request_id, by in ((first, "fay"), (stale, "gil"), (last, "fay")):
        assert (await request_json(api, request_id))["answeredBy"] == by
    for run_id in runs:
        assert (await settled_run(api, run_id, eventually))["text"].startswith("refunded 1")


async def test_the_history_shows_who_decided_what_and_when(
    api: ApiServer,
    browser: Browser,
    durable: Durable,
    eventually: Eventually,
    tag: str,
    screenshot: Shoot,
):
    # Given three refunds: fay approves one and declines one on her list ...
    await start_refunds(durable, tag, 3)
    approved, declined, edited = await opened(api, tag, 3, eventually)
    page = await logged_in(browser, api, FAY)
    await page.goto(f"/?q={tag}")
    await button(page.locator(f"#request-{approved}"), "Approve").click()
    await expect(flash(page)).to_have_text(f"Approved {approved}.")
    item = page.locator(f"#request-{declined}")
    await item.get_by_label("reason").fill("the order was cancelled")
    await button(item, "Decline").click()
    await expect(flash(page)).to_have_text(f"Declined {declined}.")
    # ... and gil approves the third with an edited amount, over the API (the requests open
    # in the order the worker takes the runs, so the third's refund is read, not assumed)
    asked = (await request_json(api, edited))["request"]["data"]["arguments"]
    async with api.http(GIL) as gil:
        body = {"decision": "edit", "arguments": {**asked, "amount": 7}}
        res = await gil.post(f"/api/requests/{edited}/decision", json=body)
        assert res.status_code == 200, res.text

    # When fay opens the history and searches it for them
    await page.get_by_role("link", name="History").click()
    await page.get_by_label("Search").fill(tag)
    await button(page, "Filter").click()

    # Then it lists the three, the newest first, each with its outcome, who and when
    count = "Showing 1–3 of 3 decided requests matching the filters"
    assert await showing(page, count) == [edited, declined, approved]
    at = r"at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    outcomes = {
        edited: rf"^edited by gil {at} \(amount: {asked['amount']:g} → 7\)\s*$",
        declined: rf"^declined by fay {at}: the order was cancelled$",
        approved: rf"^approved by fay {at}$",
    }
    for request_id, outcome in outcomes.items():
        shown = page.locator(f"#request-{request_id} p.outcome")
        await expect(shown).to_have_text(re.compile(outcome))
    await expect(page.get_by_role("link", name="History")).to_have_attribute("aria-current", "page")
    await expect(page.locator("input[name=ids]")).to_have_count(0)  # nothing to decide here
    await screenshot(page, "inbox-history")

    # And its status filter narrows it: the three were answered, none expired
    await page.goto("/history?" + urlencode({"q": tag, "status": "answered"}))
    assert await showing(page, count) == [edited, declined, approved]
    await page.goto("/history?" + urlencode({"q": tag, "status": "expired"}))
    assert await showing(page, matching(0)) == []
