"""API tokens, roles and groups.

`RELAYQ_API_TOKENS` holds comma-separated `name:role:token` entries, each
optionally followed by `:groups`, the holder's groups separated by `|` (for a `host`,
the relay tools it may serve, `*` for all):

    RELAYQ_API_TOKENS="vic:viewer:t0k-v,alice:approver:s3cret:finance|ops,sam:submitter:t0k-s"
    RELAYQ_API_TOKENS="laptop:host:t0k-h:shell|browser_click,farm:host:t0k-f:*"

A token may contain neither `:` nor `,`; a group neither `|`, `:` nor `,`. The
name is recorded as `answered_by` on every answer; the groups say which
approval requests the holder may decide (those naming one of them). A role
grants permissions:

| role | read | answer requests | create and cancel runs |
|---|---|---|---|
| `viewer` | yes | | |
| `approver` | yes | yes, and decide approvals | |
| `submitter` | yes | relay calls and questions of the runs it started; never an approval | yes |
| `host` | | its tools' relay calls, leased (`api._relay`) | |
| `admin` | yes | yes, and decide approvals; make and revoke any standing grant | |

Which requests a role may answer is the store's to say, whatever the door
(`relayq.authority`): a route only turns away a role that may answer nothing there.

The JSON API takes a token only as `Authorization: Bearer <token>`; the
inbox's cookie is no credential there, so a page that makes the browser send
the cookie (another port of the host, a sibling subdomain) cannot call it.
No token, or an unknown one, is a 401; a known token whose role lacks the
permission is a 403. A token in the URL (`?token=...`) is a 401 too, whatever
else the request carries: URLs end up in logs and browser history. Tokens are
compared in constant time, and never logged (see `api._access`) nor echoed,
not even in the error for a malformed entry.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

__all__ = [
    "ROLES",
    "URL_TOKENS",
    "Admin",
    "Answerer",
    "Host",
    "Permission",
    "Principal",
    "Reader",
    "Submitter",
    "Tokens",
    "forbidden",
    "forbidden_tools",
    "refuse_tokens_in_url",
    "require",
    "unauthorized",
]

ROLES = ("viewer", "approver", "submitter", "host", "admin")

URL_TOKENS = frozenset({"token", "access_token", "api_key", "api_token"})
"""Query parameters that would carry a token in the URL: refused."""

_FORMAT = "name:role:token or name:role:token:group|group (a host's: tool|tool, or *)"


class Permission(Enum):
    """What a route needs; the value is the roles that have it."""

    READ = frozenset({"viewer", "approver", "submitter", "admin"})
    ANSWER = frozenset({"approver", "submitter", "admin"})
    """Answering something: which requests, the store says (`relayq.authority`)."""
    SUBMIT = frozenset({"submitter"})
    LEASE = frozenset({"host"})
    ADMINISTER = frozenset({"admin"})
    """Making a standing grant directly (`store.grants` checks it again)."""


@dataclass(frozen=True, kw_only=True)
class Principal:
    """Who a token stands for."""

    name: str
    """Recorded as `answered_by` on every answer this token gives."""
    role: str
    groups: tuple[str, ...] = ()
    """The holder's groups, in the order configured; empty for a three-field entry."""
    tools: frozenset[str] | None = frozenset()
    """The relay tools a `host` may serve (None: every tool, `*`); none for other roles."""

    def may(self, permission: Permission) -> bool:
        return self.role in permission.value


def _digest(token: str) -> bytes:
    # Equal-length digests: compare_digest then takes the same time whatever the token's length.
    return hashlib.sha256(token.encode()).digest()


def _groups(field: str, where: str) -> tuple[str, ...]:
    """`finance|ops` as ("finance", "ops"); an empty field is no group."""
    if not field.strip():
        return ()
    groups = tuple(g.strip() for g in field.split("|"))
    # The group is not quoted: a field mistyped from a token must not be echoed.
    if not all(groups):
        raise ValueError(f"RELAYQ_API_TOKENS {where}: an empty group name between '|'")
    if len(set(groups)) != len(groups):
        raise ValueError(f"RELAYQ_API_TOKENS {where}: a group is named twice")
    return groups


def _entry(n: int, entry: str) -> tuple[Principal, str]:
    """One entry's principal and token; ValueError naming the entry, never its token."""
    fields = entry.split(":")
    if len(fields) not in (3, 4) or not fields[0].strip() or not fields[2]:
        # Neither the fields nor the name: with fields out of place, either may be a token.
        raise ValueError(
            f"RELAYQ_API_TOKENS entry {n} is not {_FORMAT} (a token may not contain ':')"
        )
    name, role, token = fields[0].strip(), fields[1].strip(), fields[2]
    if role not in ROLES:
        # Neither the role nor the name: with fields out of place, either may be a token.
        raise ValueError(
            f"RELAYQ_API_TOKENS entry {n}: its second field is not a role (one of "
            f"{', '.join(ROLES)}); write {_FORMAT}"
        )
    where = f"entry {n} ({name})"
    listed = _groups(fields[3], where) if len(fields) == 4 else ()
    if role == "host":
        if not listed:
            raise ValueError(
                f"RELAYQ_API_TOKENS {where}: a host names the tools it serves in its fourth "
                "field (tool|tool, or * for all)"
            )
        tools = None if listed == ("*",) else frozenset(listed)
        return Principal(name=name, role=role, tools=tools), token
    return Principal(name=name, role=role, groups=listed), token


class Tokens:
    """The configured tokens: `Tokens.parse("alice:approver:s3cret:finance|ops,...")`."""

    def __init__(self, entries: list[tuple[Principal, bytes]]) -> None:
        self._entries = entries

    @classmethod
    def parse(cls, spec: str) -> Tokens:
        """Raises ValueError for a malformed entry; the message never contains a token."""
        entries: list[tuple[Principal, bytes]] = []
        for n, entry in enumerate((e.strip() for e in spec.split(",")), start=1):
            if not entry:
                continue
            principal, token = _entry(n, entry)
            digest = _digest(token)
            if any(hmac.compare_digest(digest, d) for _, d in entries):
                raise ValueError(
                    f"RELAYQ_API_TOKENS entry {n} ({principal.name}) repeats another's token"
                )
            entries.append((principal, digest))
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


def unauthorized() -> HTTPException:
    return HTTPException(
        401, "a valid API token is required", headers={"WWW-Authenticate": "Bearer"}
    )


def forbidden(who: Principal, permission: Permission) -> HTTPException:
    return HTTPException(403, f"role {who.role!r} may not {permission.name.lower()} here")


def refuse_tokens_in_url(request: Request) -> None:
    """401 for a request with a token-like query parameter, whatever else it carries."""
    if any(name in request.query_params for name in URL_TOKENS):
        raise HTTPException(
            401,
            "a token is never taken from the URL; send it as Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )


_bearer = HTTPBearer(auto_error=False, description="An API token from RELAYQ_API_TOKENS")


def require(permission: Permission) -> Callable[..., Awaitable[Principal]]:
    """A dependency that returns the bearer token's principal, or refuses with 401 or 403.

    Only the Authorization header counts: a request carrying the inbox's cookie
    alone is a 401, so the cookie can never call the API on the user's behalf.
    """

    # A coroutine, though it awaits nothing: FastAPI runs a plain function on its thread
    # pool, a hop (and at a burst, a new thread) on every request of every route.
    async def dependency(
        request: Request,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        refuse_tokens_in_url(request)
        tokens: Tokens = request.app.state.tokens
        principal = tokens.lookup(bearer.credentials) if bearer is not None else None
        if principal is None:
            raise unauthorized()
        if not principal.may(permission):
            raise forbidden(principal, permission)
        return principal

    return dependency


Reader = Annotated[Principal, Depends(require(Permission.READ))]
Answerer = Annotated[Principal, Depends(require(Permission.ANSWER))]
Submitter = Annotated[Principal, Depends(require(Permission.SUBMIT))]
Host = Annotated[Principal, Depends(require(Permission.LEASE))]
Admin = Annotated[Principal, Depends(require(Permission.ADMINISTER))]


def forbidden_tools(who: Principal, tools: Iterable[str]) -> None:
    """403 unless the host `who` may serve every one of `tools`."""
    if who.tools is None:
        return
    refused = sorted(set(tools) - who.tools)
    if refused:
        raise HTTPException(403, f"host {who.name!r} may not serve {', '.join(refused)}")
