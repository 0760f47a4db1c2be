"""The browser tests' parts: chromium, the inbox's server, screenshots for the docs.

With `--screenshots`, the tests also save the pages docs/approvals.md shows as PNGs in docs/:

    .venv/bin/pytest tests/durable/browser --screenshots -k sqlite
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright

from ..conftest import TOKENS, ApiServer, Durable, serve_api
from ..desk import DESK_TOKENS

if TYPE_CHECKING:
    from tests.conftest import Parts

CHROMIUM = Path("/usr/bin/chromium")
DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.fixture(scope="module", autouse=True)
def chromium(machine_parts: Parts) -> None:
    """Skipped where the browser is missing; a failure where RELAYQ_REQUIRE names it (CI)."""
    if not CHROMIUM.exists():
        machine_parts.missing("browser", f"no chromium at {CHROMIUM} (apt-get install chromium)")


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    # The lookup tests' people, and the desk's (fay and gil of finance, sid of support ...).
    yield from serve_api(durable, f"{TOKENS},{DESK_TOKENS}")


LOOP = pytest.mark.asyncio(loop_scope="session")
"""The browser tests' mark: they run on the session's event loop, where `chromium_browser`
lives (playwright's objects keep to the loop that made them)."""


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def chromium_browser() -> AsyncIterator[Browser]:
    """One chromium for the lane: launching it and playwright's driver is 3 s of CPU."""
    async with async_playwright() as pw:
        # Containers often give /dev/shm 64 MiB, too little for chromium's shared memory.
        chromium = await pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--disable-dev-shm-usage"]
        )
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest_asyncio.fixture(loop_scope="session")
async def browser(chromium_browser: Browser) -> AsyncIterator[Browser]:
    """The lane's chromium, as a test's own: every context (cookies, storage, pages) the
    test opens in it is closed after the test, and none is open before."""
    assert chromium_browser.contexts == [], "a test left a browser context open"
    try:
        yield chromium_browser
    finally:
        for context in chromium_browser.contexts:
            await context.close()


Shoot = Callable[[Page, str], Awaitable[None]]


@pytest.fixture
def screenshot(pytestconfig: pytest.Config) -> Shoot:
    """`await screenshot(page, "inbox-list")` saves the whole page as docs/inbox-list.png
    under `--screenshots` (docs/approvals.md shows them); without the flag it writes nothing."""

    async def shoot(page: Page, name: str) -> None:
        if pytestconfig.getoption("--screenshots"):
            DOCS.mkdir(exist_ok=True)
            path = DOCS / f"{name}.png"
            await page.screenshot(path=path, full_page=True, animations="disabled", caret="hide")

    return shoot
