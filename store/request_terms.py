"""The words a request listing is asked in: its statuses, sorts and orders, and the one
reading, for the CLI, the API and the inbox, of the statuses and ages people type."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Literal, get_args

from store.paging import BadQuery

__all__ = [
    "MAX_AGE",
    "STATUSES",
    "RequestSort",
    "RequestStatus",
    "SortOrder",
    "age_of",
    "read_statuses",
]

RequestStatus = Literal["open", "answered", "expired", "cancelled"]
RequestSort = Literal["age", "agent", "tool"]
SortOrder = Literal["asc", "desc"]
STATUSES: tuple[str, ...] = get_args(RequestStatus)


def read_statuses(given: Sequence[str] | None) -> list[str] | None:
    """The statuses a listing asks for, read one way for the CLI and the API: repeated
    or comma-separated; `open` when none; None (every status) for `all`."""
    names = [s.strip() for value in given or () for s in value.split(",") if s.strip()]
    if "all" in names:
        return None
    return names or ["open"]


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


MAX_AGE = timedelta(days=100 * 365)
"""The longest age read: a century. Longer ones reach before any date a store can hold
(`now - age` overflows), so they are refused where they are given, not when used."""


def age_of(text: str, name: str = "older_than") -> timedelta:
    """`90s`, `15m`, `2h`, `3d`, `1w` (the units listings show ages in), at most MAX_AGE:
    the one reading of an age for the CLI, the API, the inbox and the settings; BadQuery
    naming `name` if not one."""
    found = re.fullmatch(r"\s*(\d{1,9})\s*([smhdw])\s*", text)
    if found is None:
        raise BadQuery(
            f"cannot read {text!r} as an age; write a number and a unit: 90s, 15m, 2h, 3d, 1w",
            name,
        )
    seconds = int(found.group(1)) * _UNITS[found.group(2)]
    if seconds > MAX_AGE.total_seconds():
        raise BadQuery(f"{name} {text.strip()!r} is over a century; write at most 36500d", name)
    return timedelta(seconds=seconds)
