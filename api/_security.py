"""What keeps another page from acting through the user's browser.

A page on the same *site* (another port of the host, a sibling subdomain)
gets the inbox's SameSite cookie sent along with whatever it makes the
browser post, so the cookie alone proves nothing about where a post came
from. Hence:

- every inbox form carries a CSRF token, `nonce.mac`, where mac is
  HMAC-SHA256(server secret, the SHA-256 of the cookie it is bound to, nonce):
  only a page the server rendered for that cookie holds one. A post without a
  valid one is refused (403) before anything happens;
- the JSON API takes bearer tokens only (`api._auth`), never the cookie;
- every response carries `SecurityHeaders`: no MIME sniffing, no framing, no
  referrer, and a Content-Security-Policy without inline script or style, so
  markup that slipped past escaping still could not run.

The flash message shown after an inbox action rides a cookie signed the same
way (under another purpose), so no other page can make the inbox say
"Approved" about a request it did not approve.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "CSP",
    "DOCS_CSP",
    "SECRET_BYTES",
    "SecurityHeaders",
    "Signer",
    "secret_from",
]

SECRET_BYTES = 32
"""The shortest secret taken, and the size of a generated one."""

CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self'",
    ]
)
"""The inbox's and the API's policy: the inbox's script and style are files under /static."""

DOCS_CSP = "; ".join(
    [
        "default-src 'self'",
        # FastAPI's Swagger UI and ReDoc pages load their bundles from jsdelivr and
        # start them with an inline script. They show the schema only, and the API
        # takes no cookie, so script there can do nothing a visitor could not.
        "script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net",
        "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com",
        "font-src 'self' https://fonts.gstatic.com",
        "img-src 'self' data: https://fastapi.tiangolo.com https://cdn.jsdelivr.net",
        "worker-src 'self' blob:",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self'",
    ]
)

_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class SecurityHeaders:
    """ASGI middleware: the security headers on every response, streams and errors included.

    `docs_paths` (the Swagger UI and ReDoc pages) get `DOCS_CSP`, every other path `CSP`.
    """

    def __init__(self, app: ASGIApp, *, docs_paths: tuple[str, ...] = ()) -> None:
        self.app = app
        self.docs_paths = frozenset(docs_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = DOCS_CSP if scope["path"] in self.docs_paths else CSP

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in {**_HEADERS, "Content-Security-Policy": policy}.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)


def secret_from(configured: str | None) -> bytes:
    """The server's signing secret: `configured` (RELAYQ_API_SECRET), else a fresh random one.

    A fresh one lives as long as the process: forms rendered before a restart are
    refused after it. Several API processes behind one address must share one.
    """
    if not configured:
        return secrets.token_bytes(SECRET_BYTES)
    if len(configured) < SECRET_BYTES:
        raise ValueError(f"RELAYQ_API_SECRET must be at least {SECRET_BYTES} characters long")
    return configured.encode()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


class Signer:
    """HMAC-SHA256 under the server's secret; each use signs under its own purpose,
    so a value made for one (a flash) is never valid for another (a form).

        signer = Signer(secret)
        token = signer.csrf_token(cookie)
        assert signer.csrf_valid(cookie, token)
    """

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, purpose: str, *parts: str) -> str:
        # JSON keeps the parts apart whatever they hold: ("a|b", "c") never signs as ("a", "b|c").
        message = json.dumps([purpose, *parts]).encode()
        return _b64(hmac.new(self._secret, message, hashlib.sha256).digest())

    def _matches(self, given: str, purpose: str, *parts: str) -> bool:
        # compare_digest takes ASCII strings only; a MAC is ASCII, so anything else is wrong.
        return given.isascii() and hmac.compare_digest(given, self._mac(purpose, *parts))

    def csrf_token(self, binding: str) -> str:
        """A form token valid for as long as `binding` (the cookie it is bound to) is."""
        nonce = _b64(secrets.token_bytes(16))  # a new token per page: nothing to learn from two
        return f"{nonce}.{self._mac('csrf', _fingerprint(binding), nonce)}"

    def csrf_valid(self, binding: str | None, given: str) -> bool:
        """Whether `given` was made by `csrf_token(binding)`, compared in constant time."""
        nonce, dot, mac = given.partition(".")
        if not binding or not dot or not nonce:
            return False
        return self._matches(mac, "csrf", _fingerprint(binding), nonce)

    def flash(self, kind: str, subject: str) -> str:
        """A cookie value carrying `(kind, subject)`: readable, not forgeable."""
        payload = _b64(json.dumps([kind, subject]).encode())
        return f"{payload}.{self._mac('flash', payload)}"

    def read_flash(self, value: str) -> tuple[str, str] | None:
        """`(kind, subject)` from a value `flash` made, else None."""
        payload, _, mac = value.partition(".")
        raw = _unb64(payload) if self._matches(mac, "flash", payload) else None
        if raw is None:
            return None
        kind, subject = json.loads(raw)
        return str(kind), str(subject)


def _fingerprint(binding: str) -> str:
    # The cookie holds the API token itself: sign a hash of it, never the token.
    return hashlib.sha256(binding.encode()).hexdigest()
