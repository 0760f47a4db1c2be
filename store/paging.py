"""Keyset paging: a page of rows, an honest total, and an opaque cursor to the next page.

A cursor holds the last row's sort key and id, not an offset: the next page
starts after that row, so rows inserted or closed meanwhile neither repeat
nor push others off a page, and the database seeks rather than counts.

    page = query_requests(db, RequestQuery(status="open"))
    more = query_requests(db, RequestQuery(status="open", cursor=page.next_cursor))

The cursor is base64url of the key as JSON behind a short digest of it and
of the sort it belongs to. The digest is no secret: it catches a cursor that
was cut, edited or made for another sort (its key would mean something else),
not a forger, who could read the same rows with filters anyway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from relayq import RelayqError

__all__ = ["DEFAULT_PAGE", "MAX_PAGE", "BadQuery", "Page", "decode_cursor", "encode_cursor"]

T = TypeVar("T")

DEFAULT_PAGE = 50
MAX_PAGE = 500
"""The largest page: more is a walk over pages, each one short query."""

_DIGEST = 8
_MAX_CURSOR = 2048  # far above any real key; a longer one is refused unread


class BadQuery(RelayqError, ValueError):
    """A listing's filter, sort, page size or cursor the store does not take (422 over HTTP)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, field)
        self.message = message
        self.field = field
        """The query parameter at fault: `cursor`, `status`, `limit`, ..."""

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, kw_only=True, eq=False)
class Page(Sequence[T]):
    """One page of a listing: its items, how many match in all, and the cursor to the next.

    A page is a sequence of its items (like Django's `Page`): iterate, index and
    unpack it, or compare it with a list, as with the plain lists listings
    returned before they had pages.
    """

    items: list[T]
    """This page's items, in the listing's order."""
    total: int
    """Everything that matches the filters, on every page (not only this one)."""
    next_cursor: str | None = None
    """Pass it back for the next page; None on the last page."""

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...
    def __getitem__(self, index: int | slice) -> T | list[T]:
        return self.items[index]

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Page):
            return (self.items, self.total, self.next_cursor) == (
                other.items,
                other.total,
                other.next_cursor,
            )
        if isinstance(other, list | tuple):
            return self.items == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable like one


def _digest(scope: str, body: bytes) -> bytes:
    return hashlib.blake2b(
        scope.encode() + b"\0" + body, digest_size=_DIGEST, person=b"relayq-cursor"
    ).digest()


def encode_cursor(key: list[Any], *, scope: str) -> str:
    """The cursor after the row whose sort key (ending with its id) is `key`.

    `scope` names the order the key belongs to (`age:asc`); decoding under another fails.
    """
    body = json.dumps(key, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(_digest(scope, body) + body).rstrip(b"=").decode()


def decode_cursor(cursor: str, *, scope: str, size: int) -> list[Any]:
    """The key a cursor holds, of `size` values; BadQuery if it is not one of `scope`'s."""
    if len(cursor) > _MAX_CURSOR:
        raise _bad("it is too long")
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise _bad("it is not base64url") from None
    mark, body = raw[:_DIGEST], raw[_DIGEST:]
    if len(raw) <= _DIGEST or mark != _digest(scope, body):
        raise _bad("it was cut, edited, or made for another sort or order")
    try:
        key = json.loads(body)
    except ValueError:  # a forged digest over something that is not JSON
        raise _bad("it does not hold a key") from None
    if not isinstance(key, list) or len(key) != size:
        raise _bad("it does not hold a key of this sort")
    return key


def _bad(why: str) -> BadQuery:
    return BadQuery(
        f"bad cursor: {why}; pass back the nextCursor of the previous page unchanged, "
        "with the same sort and order, or start again without a cursor",
        "cursor",
    )
