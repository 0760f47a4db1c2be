"""Each transcript message's JSON, encoded once: a long conversation's request body is
joined from the fragments of the messages it has sent before, not encoded whole again.

A message in a transcript is never changed in place (a result replaces a placeholder as
a new message), so a fragment stays true while its message lives. The cache holds the
message itself beside its fragment: its `id` cannot be reused while the entry stands.

Holding the message keeps it alive, so the cache is bounded by what it keeps alive, not
by its fragments' length: each entry is counted at the heap bytes of its message (its
dicts, lists and strings) and of its fragment, and past `limit` the entries used least
recently go first. A worker keeps one cache per provider model; at the default bound a
thousand finished runs' messages cannot grow it past 64 MiB.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["LIMIT", "Fragments", "dumps", "heap_bytes"]

LIMIT = 64 * 1024 * 1024
"""Heap bytes a cache may keep alive, its messages and fragments counted."""

_ENTRY = 200
"""An entry's own cost beside its message and fragment: its slot, key and tuple."""


def dumps(value: Any) -> str:
    """Compact UTF-8 JSON without NaN, as providers take it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def heap_bytes(value: Any) -> int:
    """The bytes `value` holds on the heap: itself and the dicts, lists and strings in it
    (a string shared with another message is counted in each: an upper bound)."""
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        for key, item in value.items():
            size += heap_bytes(key) + heap_bytes(item)
    elif isinstance(value, list | tuple):
        for item in value:
            size += heap_bytes(item)
    return size


class Fragments:
    """The JSON of each message's wire form, by the message's identity."""

    def __init__(self, wire: Callable[[dict[str, Any]], dict[str, Any]], limit: int = LIMIT):
        self._wire = wire
        self.limit = limit
        self._kept: OrderedDict[int, tuple[dict[str, Any], str, int]] = OrderedDict()
        self.size = 0
        """Heap bytes the entries keep alive, as counted."""

    def __len__(self) -> int:
        return len(self._kept)

    def of(self, message: dict[str, Any]) -> str:
        key = id(message)
        found = self._kept.get(key)
        if found is not None and found[0] is message:
            self._kept.move_to_end(key)
            return found[1]
        fragment = dumps(self._wire(message))
        cost = heap_bytes(message) + sys.getsizeof(fragment) + _ENTRY
        if found is not None:  # another message, at a dead one's address
            self.size -= self._kept.pop(key)[2]
        if cost <= self.limit:
            self._kept[key] = (message, fragment, cost)
            self.size += cost
            while self.size > self.limit:
                self.size -= self._kept.popitem(last=False)[1][2]
        return fragment
