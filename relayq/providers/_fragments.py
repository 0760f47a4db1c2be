"""Each transcript message's JSON, encoded once: a long conversation's request body is
joined from the fragments of the messages it has sent before, not encoded whole again.

A message in a transcript is never changed in place (a result replaces a placeholder as
a new message), so a fragment stays true while its message lives. The cache holds the
message itself beside its fragment: its `id` cannot be reused while the entry stands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["Fragments", "dumps"]

# At most this many bytes of fragments are kept; past it, the cache starts afresh.
_LIMIT = 32 * 1024 * 1024


def dumps(value: Any) -> str:
    """Compact UTF-8 JSON without NaN, as providers take it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class Fragments:
    """The JSON of each message's wire form, by the message's identity."""

    def __init__(self, wire: Callable[[dict[str, Any]], dict[str, Any]], limit: int = _LIMIT):
        self._wire = wire
        self._limit = limit
        self._kept: dict[int, tuple[dict[str, Any], str]] = {}
        self._size = 0

    def __len__(self) -> int:
        return len(self._kept)

    def of(self, message: dict[str, Any]) -> str:
        found = self._kept.get(id(message))
        if found is not None and found[0] is message:
            return found[1]
        fragment = dumps(self._wire(message))
        if self._size + len(fragment) > self._limit:
            self._kept.clear()
            self._size = 0
        self._kept[id(message)] = (message, fragment)
        self._size += len(fragment)
        return fragment
