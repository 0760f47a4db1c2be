"""The inbox in a real browser: the approvals flow, live updates, sessions and CSRF."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import Annotated
from urllib.parse import urlencode

import pytest
from fastapi import FastAPI, Query
from fastapi.responses import HTMLResponse
from playwright.async_api import Browser, expect

from api._inbox import CSRF_REFUSED

from ..conftest import (
    APPROVER,
    SQLITE_ONLY,
    SUBMITTER,
    VIEWER,
    ApiServer,
    Durable,
    Eventually,
    serve_in_thread,
)
from ..desk import crowd, new_tag
from ..test_api import open_request, settled_run, start_run
from .conftest import LOOP
from .pages import WAIT_MS, logged_in

pytestmark = [pytest.mark.browser, LOOP, SQLITE_ONLY]


def attacker_app() -> FastAPI:
    """Another origin (the same host, another port): pages that act on the inbox's behalf."""
    app = FastAPI()

    @app.get("/form", response_class=HTMLResponse)
    def form(action: str) -> str:
        # What a page of a sibling site would do: post the inbox's form, as a guess.
        return f"""<form id="f" method="post" action="{html.escape(action)}">
          <input name="output" value="forged"><input name="csrf_token" value="guessed.token">
        </form><script>document.getElementById("f").submit()</script>"""

    @app.get("/fetch", response_class=HTMLResponse)
    def fetch(url: Annotated[list[str], Query()]) -> str:
        # The calls a page could make with the inbox's cookie, were it taken; one after another.
        targets = json.dumps(url).replace("<", "\\u003c")  # JS that cannot end the script
        return f"""<script>(async () => {{ for (const url of {targets})
          await fetch(url, {{method: "POST", mode: "no-cors", credentials: "include"}}); }})()
        </script>"""

    return app


@pytest.fixture(scope="module")
def attacker() -> Iterator[ApiServer]:
    yield from serve_in_thread(attacker_app())


async def test_an_approver_approves_in_the_inbox_and_another_tab_follows_without_reloading(
    api: ApiServer, browser: Browser, eventually: Eventually, prompt: str
):
    # Given two runs waiting on a request each
    first = await start_run(api, "lookup", prompt)
    second = await start_run(api, "lookup", f"{prompt} again")
    first_request = (await open_request(api, first, eventually))["request"]["id"]
    second_request = (await open_request(api, second, eventually))["request"]["id"]

    # And an approver logged in, with the inbox open in two tabs
    violations: list[str] = []
    page = await logged_in(browser, api, APPROVER, violations=violations)
    other = await page.context.new_page()
    await other.goto("/")
    await other.evaluate("window.notReloaded = true")
    item = page.locator(f'[data-request-id="{first_request}"]')
    await expect(item).to_be_visible()
    await expect(item).to_contain_text("lookup")
    await expect(item).to_contain_text(first)
    await expect(item.locator(".call-name")).to_have_text("lookup")
    await expect(other.locator(f'[data-request-id="{second_request}"]')).to_be_visible()

    # When the first request is approved in the first tab, with an output of its own
    await item.get_by_label("output").fill("approved in the browser")
    await item.get_by_role("button", name="Approve").click()

    # Then the page says so, and the run resumes and completes with that output,
    # answered by the approver
    await expect(page.get_by_role("status")).to_have_text(f"Approved {first_request}.")
    await expect(page.locator(f'[data-request-id="{first_request}"]')).to_have_count(0)
    done = await settled_run(api, first, eventually)
    assert done["text"] == "approved in the browser"
    async with api.http(VIEWER) as viewer:
        stored = (await viewer.get(f"/api/requests/{first_request}")).json()
    assert stored["answeredBy"] == "alice"

    # And the other tab drops it by itself, without reloading
    gone = other.locator(f'[data-request-id="{first_request}"]')
    await expect(gone).to_have_count(0, timeout=WAIT_MS)

    # When the second request is declined elsewhere, over the API
    async with api.http(APPROVER) as approver:
        body = {"ok": False, "reason": "over the limit"}
        res = await approver.post(f"/api/requests/{second_request}/answer", json=body)
        assert res.status_code == 200, res.text

    # Then both tabs drop it too, and neither tab was reloaded
    for tab in (page, other):
        left = tab.locator(f'[data-request-id="{second_request}"]')
        await expect(left).to_have_count(0, timeout=WAIT_MS)
    assert await other.evaluate("window.notReloaded") is True
    assert (await settled_run(api, second, eventually))["text"] == "declined: over the limit"

    # And the policy that allows no inline script or style let the page's own files work
    assert violations == []
    await expect(page.locator("body")).to_have_css("max-width", "1216px")  # 76rem, inbox.css


async def test_a_viewer_sees_requests_but_no_answer_forms_and_can_log_out(
    api: ApiServer, browser: Browser, eventually: Eventually, prompt: str
):
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]

    page = await logged_in(browser, api, VIEWER)
    item = page.locator(f'[data-request-id="{request_id}"]')
    await expect(item).to_be_visible()
    await expect(item.get_by_role("button", name="Approve")).to_have_count(0)
    cookies = await page.context.cookies()
    (cookie,) = [c for c in cookies if c["name"] == "relayq_token"]
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert await page.evaluate("document.cookie") == ""

    await page.get_by_role("button", name="Log out").click()
    await expect(page.get_by_label("API token")).to_be_visible()
    assert not [c for c in await page.context.cookies() if c["name"] == "relayq_token"]

    async with api.http(APPROVER) as approver:  # leave nothing open behind
        path = f"/api/requests/{request_id}/answer"
        assert (await approver.post(path, json={"output": "done"})).status_code == 200


async def test_a_page_of_another_origin_can_neither_answer_in_the_inbox_nor_call_the_api(
    api: ApiServer,
    attacker: ApiServer,
    browser: Browser,
    eventually: Eventually,
    prompt: str,
):
    # Given a run waiting on a request, and an approver logged in to the inbox
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    page = await logged_in(browser, api, APPROVER)
    assert attacker.url.rsplit(":", 1)[0] == api.url.rsplit(":", 1)[0] != attacker.url

    # When a page of another port of the host posts the approve form in the same browser
    action = f"{api.url}/requests/{request_id}/approve"
    evil = await page.context.new_page()
    async with evil.expect_response(action) as posted:
        await evil.goto(f"{attacker.url}/form?{urlencode({'action': action})}")
    response = await posted.value

    # Then the browser sent the inbox's cookie along (the sites are the same) ...
    sent = await response.request.all_headers()
    assert "relayq_token=" in sent.get("cookie", "")
    # ... but the inbox refused the post for want of its page's CSRF token
    assert response.status == 403
    assert CSRF_REFUSED in await response.text()

    # When a submitter's browser is made to post to the inbox, then to the API
    submitter = await logged_in(browser, api, SUBMITTER)
    logout, cancel = f"{api.url}/logout", f"{api.url}/api/runs/{run_id}/cancel"
    evil = await submitter.context.new_page()
    async with (
        evil.expect_response(logout) as inbox_call,
        evil.expect_response(cancel) as api_call,
    ):
        await evil.goto(f"{attacker.url}/fetch?{urlencode({'url': [logout, cancel]}, True)}")

    # Then the cookie went along: the inbox refused the post for want of a CSRF token, not
    # of a session (Playwright shows no Cookie header for a fetch, so ask the inbox) ...
    assert (await inbox_call.value).status == 403, "a 401: the browser did not send the cookie"
    # ... and the API refused the call it came with: it takes bearer tokens only
    assert (await api_call.value).status == 401

    # And nothing changed: the request is open, in the inbox too, and the run waits
    async with api.http(VIEWER) as viewer:
        stored = (await viewer.get(f"/api/requests/{request_id}")).json()
        run = (await viewer.get(f"/api/runs/{run_id}")).json()
    assert (stored["status"], stored["answer"], run["status"]) == ("open", None, "pending")
    await page.reload()
    await expect(page.locator(f'[data-request-id="{request_id}"]')).to_be_visible()

    async with api.http(APPROVER) as approver:  # leave nothing open behind
        path = f"/api/requests/{request_id}/answer"
        assert (await approver.post(path, json={"output": "done"})).status_code == 200


async def test_the_list_is_a_compact_table_and_shows_200_a_page_when_asked(
    api: ApiServer, browser: Browser, durable: Durable
):
    # Given 210 refund approvals waiting, straight in the store
    tag = new_tag()
    with crowd(durable, tag, 210) as ids:
        # When an approver opens them on a screen 1000 px high
        page = await logged_in(browser, api, APPROVER)
        await page.set_viewport_size({"width": 1280, "height": 1000})
        await page.goto(f"/?q={tag}")
        rows = page.locator("#requests .request")
        await expect(rows).to_have_count(50)

        # Then at least 20 of them are on the screen whole, one row each
        heights: list[dict[str, float]] = await rows.evaluate_all(
            "rows => rows.map(r => r.getBoundingClientRect().toJSON())"
        )
        on_screen = [box for box in heights if box["bottom"] <= 1000]
        assert len(on_screen) >= 20, [round(box["height"]) for box in heights[:5]]

        # When she chooses 200 a page in the filter form
        await page.get_by_label("Per page").select_option("200")
        await page.get_by_role("button", name="Filter", exact=True).click()

        # Then the page shows 200, and its next page keeps the size
        await page.wait_for_url(re.compile(r"limit=200"))
        await expect(page.locator("p.count")).to_have_text(
            "Showing 1–200 of 210 open requests matching the filters"
        )
        await expect(rows).to_have_count(200)
        assert await rows.evaluate_all("rows => rows.map(r => r.dataset.requestId)") == ids[:200]
        await page.get_by_role("link", name="Next page »").click()
        await expect(page.locator("p.count")).to_have_text(
            "Showing 201–210 of 210 open requests matching the filters"
        )
        await expect(page.get_by_label("Per page")).to_have_value("200")
