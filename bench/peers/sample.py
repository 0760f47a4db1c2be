"""What one system's measured runs come to, and how a peer's process measures and hands it back.

A peer runs in a process of its own, so its CPU and bytes written are its own: the
process runs `measure_runs` around its runs and prints the sample as one JSON line
(`hand_back`), which the benchmark's process reads (`Sample.from_line`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.turns import cpu_seconds, written

LINE = "bench.peers sample: "
"""What starts the one line of a peer's output that holds its sample."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One system's runs, all started at once: what their results say, and what it spent."""

    system: str
    runs: int
    """Runs started."""
    turns_each: int
    """Model turns the model server has each run take."""
    runs_done: int
    """Runs that ended with their final answer after exactly `turns_each` turns."""
    turns: int
    """Model turns taken, counted from the runs' results."""
    seconds: float
    """From starting the runs to the end of the last one."""
    cpu_seconds: float
    """The process that runs the agent: relayq's worker, or the peer's one process."""
    host_cpu_seconds: float | None = None
    """relayq's host (the DurableClient's process); None where one process is both."""
    bytes_written: int
    """What the system's processes caused to be written to storage (/proc's write_bytes)."""
    stored_bytes: int | None
    """How much the store grew; None for a system that keeps no store."""

    def line(self) -> str:
        return LINE + json.dumps(asdict(self))

    @classmethod
    def from_line(cls, output: str) -> Sample:
        """The sample in a peer's output; ValueError if there is none."""
        for text in reversed(output.splitlines()):
            if text.startswith(LINE):
                return cls(**json.loads(text.removeprefix(LINE)))
        raise ValueError("the peer printed no sample")


@dataclass(frozen=True)
class Counters:
    """A process's CPU seconds and bytes written so far, from /proc."""

    cpu_seconds: float
    bytes_written: int

    @classmethod
    def of(cls, pid: int) -> Counters:
        return cls(cpu_seconds(pid), written(pid))

    def since(self, before: Counters) -> Counters:
        return Counters(
            self.cpu_seconds - before.cpu_seconds, self.bytes_written - before.bytes_written
        )


def sqlite_bytes(path: Path) -> int:
    """The bytes of the database's pages in use, the write-ahead log's included.

    Not the file's size: a file keeps the pages freed when migrations rebuilt a
    table, and new rows fill those first; nor the log's, which keeps its size
    after a checkpoint.
    """
    if not path.exists():
        return 0
    with closing(sqlite3.connect(path)) as db:
        pages, free, size = (
            db.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("page_count", "freelist_count", "page_size")
        )
    return int((pages - free) * size)


RunOne = Callable[[int], Awaitable[int]]
"""Runs the i-th run to its end; returns how many model turns it took."""


async def measure_runs(
    system: str, *, runs: int, turns_each: int, run_one: RunOne, store: Path | None
) -> Sample:
    """Start `runs` runs at once in this process and measure them, as a peer's users run them."""
    size = sqlite_bytes(store) if store else 0
    before = Counters.of(os.getpid())
    started = time.perf_counter()
    ends = await asyncio.gather(*(run_one(i) for i in range(runs)), return_exceptions=True)
    seconds = time.perf_counter() - started
    spent = Counters.of(os.getpid()).since(before)
    turns = [t for t in ends if isinstance(t, int)]
    errors = [e for e in ends if isinstance(e, BaseException)]
    if errors:
        print(f"{system}: {len(errors)} runs failed, the first: {errors[0]!r}", file=sys.stderr)
    return Sample(
        system=system,
        runs=runs,
        turns_each=turns_each,
        runs_done=sum(1 for t in turns if t == turns_each),
        turns=sum(turns),
        seconds=seconds,
        cpu_seconds=spent.cpu_seconds,
        bytes_written=spent.bytes_written,
        stored_bytes=sqlite_bytes(store) - size if store else None,
    )


@dataclass(frozen=True, kw_only=True)
class PeerArgs:
    """What the benchmark tells a peer's process."""

    base_url: str
    """The local model server's OpenAI-compatible base URL (ending in /v1)."""
    runs: int
    turns: int
    """Turns the server has each run take: the peer sets its own limits to allow them."""
    home: Path
    """A fresh folder for the peer's store, if it keeps one."""


def hand_back(drive: Callable[[PeerArgs], Coroutine[Any, Any, Sample]]) -> None:
    """A peer process's main: read the benchmark's arguments, drive the runs, print the sample."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--home", type=Path, required=True)
    args = parser.parse_args()
    peer = PeerArgs(base_url=args.base_url, runs=args.runs, turns=args.turns, home=args.home)
    print(asyncio.run(drive(peer)).line(), flush=True)
