"""Identities with groups, CSRF, cookie-less API and security headers, over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from api._inbox import CSRF_REFUSED
from api._security import CSP, DOCS_CSP, Signer
from api.app import create_app
from tests.api.tokens import SECRET

from .conftest import (
    APPROVER,
    OTHER_APPROVER,
    SUBMITTER,
    TOKENS,
    VIEWER,
    ApiServer,
    Durable,
    Eventually,
    serve_api,
)
from .test_api import csrf_of, log_in, open_request, settled_run, start_run

GROUPED = "tok-gus-1"
# The shared three-field entries, and one with groups: both formats in one setting.
SECURITY_TOKENS = f"{TOKENS},gus:approver:{GROUPED}:finance|ops"


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable, SECURITY_TOKENS)


# --- tokens and groups ---


def test_the_api_does_not_start_with_a_malformed_entry(durable: Durable):
    with pytest.raises(ValueError, match="entry 2 is not") as refused:
        create_app(durable.settings, tokens=f"vic:viewer:t1,alice:approver:{SECRET}:a:b")
    assert SECRET not in str(refused.value)


async def test_the_inbox_shows_the_groups_of_who_is_logged_in(api: ApiServer):
    async with api.http() as gus, api.http() as alice:
        await log_in(gus, GROUPED)
        await log_in(alice, APPROVER)
        grouped, plain = (await gus.get("/")).text, (await alice.get("/")).text
    assert 'gus (approver) · <span class="groups">finance, ops</span>' in grouped
    assert "alice (approver)</span>" in plain
    assert 'class="groups"' not in plain


# --- the API: bearer tokens only ---


async def test_the_api_refuses_the_inbox_cookie_alone_with_401_and_takes_the_bearer_token(
    api: ApiServer, eventually: Eventually, prompt: str
):
    # Given a run waiting on a request, and inbox sessions of a submitter and an approver
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    async with api.http() as submitter, api.http() as approver:
        await log_in(submitter, SUBMITTER)
        await log_in(approver, APPROVER)

        # When their cookies alone call the API
        refused = [
            await submitter.post(f"/api/runs/{run_id}/cancel"),
            await submitter.post("/api/runs", json={"agent": "lookup", "prompt": prompt}),
            await approver.post(f"/api/requests/{request_id}/answer", json={"output": "x"}),
            await approver.get("/api/runs"),
            await approver.get(f"/api/requests/{request_id}"),
        ]

    # Then each is a 401 asking for a bearer token, and nothing changed
    for res in refused:
        assert res.status_code == 401, res.text
        assert res.json()["detail"] == "a valid API token is required"
        assert res.headers["www-authenticate"] == "Bearer"
    async with api.http(VIEWER) as viewer:
        stored = (await viewer.get(f"/api/requests/{request_id}")).json()
        run = (await viewer.get(f"/api/runs/{run_id}")).json()
    assert (stored["status"], stored["answeredBy"], run["status"]) == ("open", None, "pending")

    # And the same calls with the bearer token are taken
    async with api.http(SUBMITTER) as bearer:
        cancelled = await bearer.post(f"/api/runs/{run_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == {"id": run_id, "status": "cancelled"}


# --- CSRF ---


async def test_an_inbox_post_without_its_pages_csrf_token_is_403_and_changes_nothing(
    api: ApiServer, eventually: Eventually, prompt: str
):
    # Given a run waiting on a request, and alice and bob logged in to the inbox
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    async with api.http() as alice, api.http() as bob, api.http() as stranger:
        csrf = await log_in(alice, APPROVER)
        bobs = await log_in(bob, OTHER_APPROVER)
        login_form = csrf_of((await stranger.get("/")).text)
        forged = {
            "none": None,
            "empty": "",
            "made up": "abc.def",
            "bob's page": bobs,
            "the login form": login_form,
            "another server's": Signer(b"x" * 32).csrf_token(APPROVER),
            "tampered": csrf[:-2] + ("AA" if not csrf.endswith("AA") else "BB"),
        }

        # When alice's browser posts each form with a token her page did not hold
        posts = {
            f"/requests/{request_id}/approve": {"output": "forged"},
            f"/requests/{request_id}/decline": {"reason": "forged"},
            f"/requests/{request_id}/edit": {"arg:q": "forged"},
            "/bulk/preview": {"action": "decline-selected", "ids": request_id},
            "/bulk": {"decision": "decline", "items": f"{request_id}:0", "reason": "forged"},
        }
        for what, token in forged.items():
            for path, fields in posts.items():
                form = fields | ({} if token is None else {"csrf_token": token})
                res = await alice.post(path, data=form)

                # Then each is refused, saying why
                assert res.status_code == 403, (what, path, res.text)
                assert res.json()["detail"] == CSRF_REFUSED
        logout = await alice.post("/logout")
        assert logout.status_code == 403
        assert logout.json()["detail"] == CSRF_REFUSED

        # And nothing changed: the request is open, the run waits, alice is still logged in
        async with api.http(VIEWER) as viewer:
            stored = (await viewer.get(f"/api/requests/{request_id}")).json()
            run = (await viewer.get(f"/api/runs/{run_id}")).json()
        assert (stored["status"], stored["answer"], run["status"]) == ("open", None, "pending")
        page = await alice.get("/")
        assert f'data-request-id="{request_id}"' in page.text

        # When her own page's form is posted
        res = await alice.post(
            f"/requests/{request_id}/decline", data={"reason": "no", "csrf_token": csrf}
        )

    # Then it is taken
    assert res.status_code == 303, res.text
    assert (await settled_run(api, run_id, eventually))["text"] == "declined: no"


async def test_a_login_post_without_the_login_forms_token_is_403_and_logs_nobody_in(
    api: ApiServer,
):
    async with api.http() as browser, api.http() as other:
        others = csrf_of((await other.get("/")).text)
        await browser.get("/")
        for form in ({"token": APPROVER}, {"token": APPROVER, "csrf_token": others}):
            res = await browser.post("/login", data=form)
            assert res.status_code == 403, res.text
            assert res.json()["detail"] == CSRF_REFUSED
            assert "relayq_token" not in res.headers.get("set-cookie", "")
        assert 'name="token"' in (await browser.get("/")).text


async def test_a_flash_message_is_shown_only_if_the_server_signed_it(api: ApiServer):
    async with api.http() as browser:
        csrf = await log_in(browser, APPROVER)
        for forged in (Signer(b"y" * 32).flash("approved", "req_fake"), "approved:req_fake"):
            browser.cookies.set("relayq_flash", forged)
            page = await browser.get("/")
            assert page.status_code == 200
            assert "req_fake" not in page.text
            assert 'class="flash"' not in page.text
            browser.cookies.delete("relayq_flash")

        # Logging out is confirmed, on the login page
        res = await browser.post("/logout", data={"csrf_token": csrf})
        assert res.status_code == 303
        page = await browser.get("/")
    assert 'name="token"' in page.text
    assert '<p class="flash" role="status">Logged out.</p>' in page.text


# --- headers ---


def assert_secure_headers(res: httpx.Response, policy: str = CSP) -> None:
    what = f"{res.request.method} {res.request.url.path} -> {res.status_code}"
    assert res.headers.get("x-content-type-options") == "nosniff", what
    assert res.headers.get("x-frame-options") == "DENY", what
    assert res.headers.get("referrer-policy") == "no-referrer", what
    assert res.headers.get("content-security-policy") == policy, what


async def test_every_response_of_the_api_and_the_inbox_carries_the_security_headers(
    api: ApiServer, eventually: Eventually, prompt: str
):
    run_id = await start_run(api, "lookup", prompt)
    request_id = (await open_request(api, run_id, eventually))["request"]["id"]
    seen: list[httpx.Response] = []
    async with api.http(VIEWER) as viewer, api.http() as browser:
        # The API: answers, refusals, the schema
        seen += [
            await viewer.get("/api/runs"),
            await viewer.get(f"/api/requests/{request_id}"),
            await viewer.get("/api/runs/run_nope"),
            await viewer.get("/api/runs", params={"status": "sleeping"}),
            await viewer.post("/api/runs", json={"agent": "lookup", "prompt": "p"}),
            await browser.get("/api/runs"),
            await viewer.get("/openapi.json"),
            await viewer.get("/nowhere"),
        ]
        # The inbox: login, redirects, pages, files, refusals
        seen.append(await browser.get("/"))
        csrf = await log_in(browser, APPROVER)
        seen += [
            await browser.get("/"),
            await browser.get("/static/inbox.js"),
            await browser.get("/static/inbox.css"),
            await browser.post(f"/requests/{request_id}/approve", data={"output": "x"}),
            await browser.post(
                f"/requests/{request_id}/approve", data={"output": "ok", "csrf_token": csrf}
            ),
            await browser.post("/requests/req_nope/decline", data={"csrf_token": csrf}),
        ]
        # The event streams, as they start
        for client, path in ((viewer, "/api/events"), (browser, "/events")):
            async with client.stream("GET", path) as stream:
                assert stream.status_code == 200
                assert_secure_headers(stream)
        docs = await viewer.get("/docs")

    codes = sorted({res.status_code for res in seen})
    assert codes == [200, 303, 401, 403, 404, 422], codes
    for res in seen:
        assert_secure_headers(res)
    assert_secure_headers(docs, DOCS_CSP)
    assert (await settled_run(api, run_id, eventually))["text"] == "ok"
