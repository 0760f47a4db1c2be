"""Reading and driving the inbox's pages in the browser tests."""

from __future__ import annotations

import re
from typing import Any

from playwright.async_api import Browser, ConsoleMessage, Locator, Page, Response, expect

from ..conftest import ApiServer, Eventually
from ..desk import VAL, ids_of, waiting

WAIT_MS = 15_000


async def logged_in(
    browser: Browser, api: ApiServer, token: str, *, violations: list[str] | None = None
) -> Page:
    """A new browser context logged in to the inbox; `violations` collects the
    Content-Security-Policy errors its pages' consoles report."""
    context = await browser.new_context(base_url=api.url, viewport={"width": 1280, "height": 900})

    def note(message: ConsoleMessage) -> None:
        if violations is not None and "Content Security Policy" in message.text:
            violations.append(message.text)

    context.on("console", note)
    page = await context.new_page()
    await page.goto("/")
    await page.get_by_label("API token").fill(token)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="relayq inbox")).to_be_visible()
    await expect(page.locator("#requests")).to_be_visible(timeout=WAIT_MS)
    return page


async def open_ids(api: ApiServer, tag: str) -> list[str]:
    """The open requests tagged `tag`, oldest first."""
    async with api.http(VAL) as viewer:
        params: dict[str, Any] = {"q": tag, "status": "open", "limit": 500}
        page = (await viewer.get("/api/requests", params=params)).json()
    return [item["request"]["id"] for item in page["items"]]


async def opened(api: ApiServer, tag: str, count: int, eventually: Eventually) -> list[str]:
    """The ids of the open requests tagged `tag`, oldest first, once all `count` are open."""
    return ids_of(await waiting(api, tag, count, eventually))


async def request_json(api: ApiServer, request_id: str) -> dict[str, Any]:
    """The request as the API shows it."""
    async with api.http(VAL) as viewer:
        found: dict[str, Any] = (await viewer.get(f"/api/requests/{request_id}")).json()
    return found


def flash(page: Page) -> Locator:
    """What the last action did (not inbox.js's note that requests changed meanwhile)."""
    return page.locator("p.flash[role=status]:not(#changed)")


def fact(page: Page, name: str) -> Locator:
    """The value of a row of a request's facts table (Started by, Quorum ...)."""
    heading = page.locator("th", has_text=re.compile(f"^{name}$"))
    return page.locator("table.facts tr").filter(has=heading).locator("td")


def button(where: Page | Locator, name: str) -> Locator:
    return where.get_by_role("button", name=name, exact=True)


async def listed(page: Page) -> list[str]:
    """The ids of the requests the list shows, in its order."""
    items = page.locator("tr.request")
    ids: list[str] = await items.evaluate_all("items => items.map(i => i.dataset.requestId)")
    return ids


async def showing(page: Page, count: str) -> list[str]:
    """The ids a list shows, once its count line says `count`."""
    await expect(page.locator("p.count")).to_have_text(count)
    await page.wait_for_load_state()
    return await listed(page)


def matching(n: int) -> str:
    """An open list's count line, filtered, for `n` requests on one page."""
    if n == 0:
        return "No request matches."
    return f"Showing 1–{n} of {n} open request{'s' if n != 1 else ''} matching the filters"


async def posted(page: Page, clicked: Locator, path: str) -> Response:
    """Click a form's button: the response to its post to `path`."""

    def to_path(response: Response) -> bool:
        return response.request.method == "POST" and response.url.endswith(path)

    async with page.expect_response(to_path) as answer:
        await clicked.click()
    return await answer.value
