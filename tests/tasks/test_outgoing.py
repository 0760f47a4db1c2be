"""Rows sent from the loop go to the sending thread in batches: whatever is published while a
batch is going out goes with the next, in one hand-off; each caller learns what of its own went."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from store import OutboxRow
from tasks.outgoing import Outgoing


def row(n: int) -> OutboxRow:
    return OutboxRow(id=n, task="t", queue="q", args=[n], label=f"row {n}")


class Sender:
    """Sends every row but those named in `refuse`; the first batch waits for `release`."""

    def __init__(self, refuse: frozenset[int] = frozenset()) -> None:
        self.batches: list[list[int]] = []
        self.refuse = refuse
        self.release = threading.Event()
        self.holding = threading.Event()
        """Set once the first batch is in the sender's hands."""
        self.threads: set[str] = set()

    def __call__(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        self.threads.add(threading.current_thread().name)
        self.batches.append([r.id or 0 for r in rows])
        if len(self.batches) == 1:
            self.holding.set()
            self.release.wait(5)
        if any(r.id == 99 for r in rows):
            raise RuntimeError("the broker fell over")
        return [r for r in rows if r.id not in self.refuse]


async def test_what_is_published_while_a_batch_goes_out_goes_with_the_next_in_one_hand_off():
    sender = Sender(refuse=frozenset({4}))
    with ThreadPoolExecutor(1, thread_name_prefix="send") as pool:
        outgoing = Outgoing(sender, pool)
        first = asyncio.create_task(outgoing([row(1)]))
        assert await asyncio.to_thread(sender.holding.wait, 5), "the first batch never went"
        later = [asyncio.create_task(outgoing([row(n), row(n + 1)])) for n in (2, 4)]
        await asyncio.sleep(0)  # each later caller runs up to its wait, behind the first batch
        sender.release.set()
        went = await asyncio.gather(first, *later)

    assert sender.batches == [[1], [2, 3, 4, 5]]
    assert [[r.id for r in rows] for rows in went] == [[1], [2, 3], [5]]
    assert sender.threads == {"send_0"}


async def test_a_batch_that_fails_fails_its_callers_and_the_next_still_goes():
    sender = Sender()
    sender.release.set()
    with ThreadPoolExecutor(1) as pool:
        outgoing = Outgoing(sender, pool)
        with pytest.raises(RuntimeError, match="fell over"):
            await outgoing([row(99)])
        assert [r.id for r in await outgoing([row(7)])] == [7]
