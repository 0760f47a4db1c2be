"""The transcripts of the runs this process took the last turn of, kept for their next.

A turn message carries the version the run must be at to be claimed, and every
change to a run (a turn, an answer, a cancel) moves its version. So when this
process finishes a turn and queues the next at version v, and later claims that
message at v, nothing can have changed the run in between: the transcript it
kept is the stored one, and the claim reads none of it. A turn that went to
another process, a redelivery, an answer in between: the versions differ, or
the entry is gone, and the claim reads the transcript whole.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["Transcripts"]


class Transcripts:
    """Run id -> (the version its next turn claims at, its transcript), the least
    recently kept dropped past `size`. Used from the process's event loop only."""

    def __init__(self, size: int = 2000) -> None:
        self.size = size
        self._kept: OrderedDict[str, tuple[int, list[dict[str, Any]]]] = OrderedDict()

    def keep(self, run_id: str, version: int, messages: list[dict[str, Any]]) -> None:
        self._kept[run_id] = (version, messages)
        self._kept.move_to_end(run_id)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def take(self, run_id: str, version: int) -> list[dict[str, Any]] | None:
        """The transcript kept for the claim of `run_id` at `version`, once; else None."""
        entry = self._kept.pop(run_id, None)
        if entry is None or entry[0] != version:
            return None
        return entry[1]

    def __len__(self) -> int:
        return len(self._kept)
