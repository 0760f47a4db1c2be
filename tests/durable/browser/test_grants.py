"""A standing grant in a real browser: fay (finance) approves a refund and grants the
same for refunds like it, the next one runs without asking anyone, and once she
revokes the grant on the Grants page the next one asks again."""

from __future__ import annotations

import pytest
from playwright.async_api import Browser, expect

from ..conftest import SQLITE_ONLY, ApiServer, Durable, Eventually
from ..desk import FAY, VAL, start_refunds
from ..test_api import settled_run
from .conftest import LOOP
from .pages import button, flash, logged_in, opened

pytestmark = [pytest.mark.browser, LOOP, SQLITE_ONLY]


async def test_a_grant_made_in_the_inbox_spares_people_until_it_is_revoked(
    api: ApiServer, browser: Browser, durable: Durable, eventually: Eventually, tag: str
):
    # Given a refund of 30 waiting on finance
    await start_refunds(durable, tag, 1, amount=30)
    (request_id,) = await opened(api, tag, 1, eventually)

    # When fay approves it, and the same for this desk's refunds like it, up to 40
    page = await logged_in(browser, api, FAY)
    await page.goto(f"/requests/{request_id}")
    await page.get_by_text("Approve, and approve the same for calls to come").click()
    await page.get_by_label("scope").select_option("agent")
    await page.get_by_label("for", exact=True).fill("2h")
    await page.get_by_label("max uses").fill("5")
    await page.get_by_label("match").fill(f'note == "{tag}"\namount <= 40')
    await button(page, "Approve and grant").click()
    await expect(flash(page)).to_have_text(
        f"Approved {request_id}, and the same for calls to come: see Grants."
    )

    # Then the next refund like it runs without a request
    (spared,) = await start_refunds(durable, tag, 1, amount=35)
    run = await settled_run(api, spared, eventually, token=VAL)
    assert run["text"] == "refunded 35 on order 00000"

    # And the Grants page shows it used once; fay revokes it there
    await page.get_by_role("link", name="Grants").click()
    row = page.locator("tr[data-grant-id]").filter(has_text=tag)
    await expect(row.locator("td.uses")).to_have_text("1 of 5")
    await expect(row.locator("td.covers")).to_have_text(f'note == "{tag}" and amount <= 40')
    await button(row, "Revoke").click()
    await expect(flash(page)).to_contain_text("Revoked grt_")
    await page.get_by_label("Status").select_option("revoked")
    await button(page, "Show").click()
    revoked = page.locator("tr[data-grant-id]").filter(has_text=tag)
    await expect(revoked.locator("td.status")).to_have_text("revoked")

    # Then the next refund like it asks a person again
    await start_refunds(durable, tag, 1, amount=35)
    await opened(api, tag, 1, eventually)


async def test_a_grant_the_policy_refuses_is_shown_on_the_request_page_and_decides_nothing(
    api: ApiServer, browser: Browser, durable: Durable, eventually: Eventually, tag: str
):
    # Given a refund waiting on finance
    await start_refunds(durable, tag, 1, amount=20)
    (request_id,) = await opened(api, tag, 1, eventually)

    # When fay asks for a grant lasting forever
    page = await logged_in(browser, api, FAY)
    await page.goto(f"/requests/{request_id}")
    await page.get_by_text("Approve, and approve the same for calls to come").click()
    await page.get_by_label("for", exact=True).fill("forever")
    await button(page, "Approve and grant").click()

    # Then the page says why, and the request is still open
    await expect(page.locator("p.error, [role=alert]").first).to_contain_text("a grant lasts")
    await opened(api, tag, 1, eventually)
