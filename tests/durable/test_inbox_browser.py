"""The inbox in a real browser (Debian's chromium, driven by Playwright), real workers behind it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from api.app import create_app

from .conftest import Durable, Eventually
from .test_api import (
    APPROVER,
    TOKENS,
    VIEWER,
    ApiServer,
    open_request,
    serve_in_thread,
    settled_run,
    start_run,
)

if TYPE_CHECKING:
    from tests.conftest import Parts

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = pytest.mark.browser

WAIT_MS = 15_000


@pytest.fixture(scope="module", autouse=True)
def chromium(machine_parts: Parts) -> None:
    """Skipped where the browser is missing; a failure where RELAYQ_REQUIRE names it (CI)."""
    if not CHROMIUM.exists():
        machine_parts.missing("browser", f"no chromium at {CHROMIUM} (apt-get install chromium)")


@pytest.fixture(scope="module")
def inbox_api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_in_thread(create_app(durable.settings, tokens=TOKENS))


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        # Containers often give /dev/shm 64 MiB, too little for chromium's shared memory.
        chromium = await pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--disable-dev-shm-usage"]
        )
        try:
            yield chromium
        finally:
            await chromium.close()


async def logged_in(browser: Browser, api: ApiServer, token: str) -> Page:
    context = await browser.new_context(base_url=api.url)
    page = await context.new_page()
    await page.goto("/")
    await page.get_by_label("API token").fill(token)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="relayq inbox")).to_be_visible()
    await expect(page.locator("#requests")).to_be_visible(timeout=WAIT_MS)
    return page


async def test_an_approver_approves_in_the_inbox_and_another_tab_follows_without_reloading(
    inbox_api: ApiServer, browser: Browser, eventually: Eventually, prompt: str
):
    api = inbox_api
    # Given two runs waiting on a request each
    first = await start_run(api, "lookup", prompt)
    second = await start_run(api, "lookup", f"{prompt} again")
    first_request = (await open_request(api, first, eventually))["request"]["id"]
    second_request = (await open_request(api, second, eventually))["request"]["id"]

    # And an approver logged in, with the inbox open in two tabs
    page = await logged_in(browser, api, APPROVER)
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

    # Then the run resumes and completes with that output, answered by the approver
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


async def test_a_viewer_sees_requests_but_no_answer_forms_and_can_log_out(
    inbox_api: ApiServer, browser: Browser, eventually: Eventually, prompt: str
):
    api = inbox_api
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
