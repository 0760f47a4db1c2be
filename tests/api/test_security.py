"""The inbox's signed values and security policy (`api._security`): a CSRF token or a flash
message holds only for what and whom it was made, across processes sharing the secret; the
content security policy allows no inline script and no framing."""

from __future__ import annotations

import pytest

from api._security import CSP, DOCS_CSP, Signer, secret_from


def test_a_signed_value_holds_only_for_what_and_whom_it_was_made():
    signer = Signer(b"k" * 32)
    token = signer.csrf_token("cookie-a")

    assert signer.csrf_valid("cookie-a", token)
    assert signer.csrf_token("cookie-a") != token  # a fresh nonce each page
    assert not signer.csrf_valid("cookie-b", token)
    assert not signer.csrf_valid(None, token)
    assert not Signer(b"j" * 32).csrf_valid("cookie-a", token)
    assert not signer.csrf_valid("cookie-a", "ünïcode.tøken")
    flash = signer.flash("approved", "req_1")
    assert signer.read_flash(flash) == ("approved", "req_1")
    assert not signer.csrf_valid("cookie-a", flash)  # one purpose's value is not another's
    assert signer.read_flash(token) is None


def test_processes_sharing_the_secret_take_each_others_forms_and_a_short_one_is_refused():
    shared = "a-secret-shared-by-every-api-process"
    token = Signer(secret_from(shared)).csrf_token("cookie-a")

    assert Signer(secret_from(shared)).csrf_valid("cookie-a", token)
    assert not Signer(secret_from(None)).csrf_valid("cookie-a", token)  # a random one each
    with pytest.raises(ValueError, match="at least 32 characters") as refused:
        secret_from("too-short-secret")
    assert "too-short-secret" not in str(refused.value)


def test_the_policy_allows_no_inline_script_and_no_framing():
    assert "script-src 'self';" in CSP
    assert "unsafe" not in CSP
    assert "frame-ancestors 'none'" in CSP
    assert "frame-ancestors 'none'" in DOCS_CSP
