"""API tokens and roles.

`RELAYQ_API_TOKENS` holds comma-separated `name:role:token` entries. A role
grants permissions:

| role | read | answer requests | create and cancel runs |
|---|---|---|---|
| `viewer` | yes | | |
| `approver` | yes | yes | |
| `submitter` | yes | | yes |

A token comes as `Authorization: Bearer <token>`, or in the inbox's cookie.
No token, or an unknown one, is a 401; a known token whose role lacks the
permission is a 403. A token in the URL (`?token=...`) is a 401 too, whatever
else the request carries: URLs end up in logs and browser history. Tokens are
compared in constant time, and never logged (see `api._access`) nor echoed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

__all__ = [
    "COOKIE",
    "ROLES",
    "URL_TOKENS",
    "Answerer",
    "Permission",
    "Principal",
    "Reader",
    "Submitter",
    "Tokens",
    "principal_of",
    "require",
]

COOKIE = "relayq_token"
"""The inbox's cookie: HttpOnly, SameSite=Strict, holding the token itself."""

ROLES = ("viewer", "approver", "submitter")

URL_TOKENS = frozenset({"token", "access_token", "api_key", "api_token"})
"""Query parameters that would carry a token in the URL: refused."""


class Permission(Enum):
    """What a route needs; the value is the roles that have it."""

    READ = frozenset(ROLES)
    ANSWER = frozenset({"approver"})
    SUBMIT = frozenset({"submitter"})


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Who a token stands for."""

    name: str
    """Recorded as `answered_by` on every answer this token gives."""
    role: str

    def may(self, permission: Permission) -> bool:
        return self.role in permission.value


def _digest(token: str) -> bytes:
    # Equal-length digests: compare_digest then takes the same time whatever the token's length.
    return hashlib.sha256(token.encode()).digest()


class Tokens:
    """The configured tokens; `Tokens.parse("alice:approver:s3cret,...")`."""

    def __init__(self, entries: list[tuple[Principal, bytes]]) -> None:
        self._entries = entries

    @classmethod
    def parse(cls, spec: str) -> Tokens:
        """Raises ValueError for a malformed entry; the message never contains a token."""
        entries: list[tuple[Principal, bytes]] = []
        for n, entry in enumerate((e.strip() for e in spec.split(",")), start=1):
            if not entry:
                continue
            name, role, token = [*entry.split(":", 2), "", ""][:3]
            if not name or not token:
                raise ValueError(f"RELAYQ_API_TOKENS entry {n} is not name:role:token")
            if role not in ROLES:
                raise ValueError(
                    f"RELAYQ_API_TOKENS entry {n} ({name}): role {role!r} is not one of "
                    f"{', '.join(ROLES)}"
                )
            digest = _digest(token)
            if any(hmac.compare_digest(digest, d) for _, d in entries):
                raise ValueError(f"RELAYQ_API_TOKENS entry {n} ({name}) repeats another's token")
            entries.append((Principal(name=name, role=role), digest))
        return cls(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, token: str) -> Principal | None:
        """The token's principal; every entry is compared, so timing tells nothing."""
        given = _digest(token)
        found = None
        for principal, digest in self._entries:
            if hmac.compare_digest(given, digest) and found is None:
                found = principal
        return found


_bearer = HTTPBearer(auto_error=False, description="An API token from RELAYQ_API_TOKENS")


def principal_of(request: Request, bearer: HTTPAuthorizationCredentials | None) -> Principal | None:
    """The bearer token's principal, else the cookie's; None if neither is a known token."""
    tokens: Tokens = request.app.state.tokens
    token = bearer.credentials if bearer is not None else request.cookies.get(COOKIE)
    return tokens.lookup(token) if token else None


def require(permission: Permission) -> Callable[..., Principal]:
    """A dependency that returns the caller's principal, or refuses with 401 or 403."""

    def dependency(
        request: Request,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        if any(name in request.query_params for name in URL_TOKENS):
            raise HTTPException(
                401,
                "a token is never taken from the URL; send it as Authorization: Bearer <token>",
                headers={"WWW-Authenticate": "Bearer"},
            )
        principal = principal_of(request, bearer)
        if principal is None:
            raise HTTPException(
                401, "a valid API token is required", headers={"WWW-Authenticate": "Bearer"}
            )
        if not principal.may(permission):
            raise HTTPException(
                403, f"role {principal.role!r} may not {permission.name.lower()} here"
            )
        return principal

    return dependency


Reader = Annotated[Principal, Depends(require(Permission.READ))]
Answerer = Annotated[Principal, Depends(require(Permission.ANSWER))]
Submitter = Annotated[Principal, Depends(require(Permission.SUBMIT))]
