"""Provider limits shared by two worker processes, against a real HTTP provider.

Two workers on one broker and key prefix run the `limited` agent
(tests/durable/limit_agents.py: two model calls a run) against this test's
`ProviderServer`, which notes when each call arrived, what it answered, and
how many calls it held at once. Nothing here asserts a duration: counts per
window, peaks, and what came before what.

A call's moment is reserved in Redis and the call reaches the server a little
later, by as much as its worker's event loop and the machine's other work make
it: so a window at the server may hold calls from the moments before it. The
checks (`assert_kept_to`) hold against that however loaded the machine is: no
window of two seconds holds more than the limit allows in it and in the `LATE`
second before it, and the calls span at least the time the limit gives them,
less `LATE` (a late call only lengthens the span). A worker's first call is
left out: it builds the worker's HTTP client (a CA bundle, a connection pool)
after its moment.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select

from store import RunRow
from tasks import DurableClient, Settings
from tests.provider_server import API_KEY, ProviderServer, Reply, error

from .conftest import SQLITE_ONLY, Durable, Worker
from .sent_messages import sent_messages

pytestmark = [pytest.mark.timeout(150), SQLITE_ONLY]


@dataclass(frozen=True)
class Call:
    at: float
    prompt: str
    turn: int
    status: int
    tokens: int
    first: bool
    """The first call of the worker that made it."""


class Provider:
    """What the server answers: `step` on a run's first call, text on its second; and,
    first, any replies in `refuse`. Every call is noted."""

    def __init__(self, *, delay: float = 0.0, tokens: tuple[int, int] = (10, 5)) -> None:
        self.delay = delay
        self.tokens = tokens
        self.refuse: list[Reply] = []
        self.calls: list[Call] = []
        self.server: ProviderServer | None = None
        self._workers: set[str] = set()
        self._lock = threading.Lock()

    def serve(self) -> ProviderServer:
        self.server = ProviderServer(self)
        return self.server

    def __call__(self, dialect: str, body: dict[str, Any]) -> Reply:
        at = time.monotonic()
        prompt = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
        turn = sum(1 for m in body["messages"] if m["role"] == "tool")
        with self._lock:
            worker = self._worker_of(body)
            first = worker not in self._workers
            self._workers.add(worker)
            reply = self.refuse.pop(0) if self.refuse else self._reply(turn)
            tokens = sum(self.tokens) if reply.status == 200 else 0
            self.calls.append(Call(at, prompt, turn, reply.status, tokens, first))
        return reply

    def _worker_of(self, body: dict[str, Any]) -> str:
        assert self.server is not None
        seen = next(s for s in reversed(self.server.seen) if s.body is body)
        return seen.headers.get("x-test-worker", "?")

    def _reply(self, turn: int) -> Reply:
        if turn == 0:
            step = {"name": "step", "arguments": "{}"}
            call = {"id": "call_0", "type": "function", "function": step}
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": "done"}
            finish = "stop"
        prompt, completion = self.tokens
        return Reply(
            {
                "id": "chatcmpl-limits",
                "object": "chat.completion",
                "model": "limits-model",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            },
            delay=self.delay,
        )

    def answered(self, prefix: str) -> list[Call]:
        return [c for c in self.calls if c.status == 200 and c.prompt.startswith(prefix)]

    def warm(self, prefix: str) -> list[Call]:
        """The answered calls but each worker's first."""
        return [c for c in self.answered(prefix) if not c.first]


def most_in_window(calls: list[Call], width: float, weight: Callable[[Call], int]) -> int:
    """The most `weight` summed over the calls that arrived within any `width` seconds."""
    calls = sorted(calls, key=lambda c: c.at)
    best = total = start = 0
    for call in calls:
        total += weight(call)
        while call.at - calls[start].at >= width:
            total -= weight(calls[start])
            start += 1
        best = max(best, total)
    return best


LATE = 1.0
"""The most seconds a call reaches the server after its reserved moment, even on two
cores running four lanes of tests."""


def assert_kept_to(calls: list[Call], per_second: float, weight: Callable[[Call], int]) -> None:
    """The calls kept to `per_second` of `weight`: no burst, and no rate above it."""
    assert calls, "no call reached the server"
    heaviest = max(weight(c) for c in calls)
    assert most_in_window(calls, 2.0, weight) <= per_second * (2.0 + LATE) + heaviest
    # A call's moment is one call's weight after the one before it, so the calls' moments
    # span all the weight but the last call's; each reached the server late by 0 to LATE.
    by_arrival = sorted(calls, key=lambda c: c.at)
    span = by_arrival[-1].at - by_arrival[0].at
    assert span >= (sum(weight(c) for c in calls) - heaviest) / per_second - LATE


StartPair = Callable[..., Durable]


@pytest.fixture
def two_workers(durable: Durable, tmp_path: Path) -> Iterator[StartPair]:
    """Start two worker processes on one fresh key prefix, serving the `limited` agent
    against `server`, with `env` over the session's environment."""
    started: list[Worker] = []

    def start(server: ProviderServer, **env: str) -> Durable:
        merged = {
            **durable.env,
            "RELAYQ_KEY_PREFIX": durable.broker.new_prefix(),
            "RELAYQ_AGENTS": "tests.durable.limit_agents",
            "RELAYQ_TEST_LIMITS_URL": server.openai_url,
            "RELAYQ_TEST_LIMITS_KEY": API_KEY,
            "RELAYQ_CONCURRENCY": "50",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            **env,
        }
        workers = [
            Worker(merged | {"RELAYQ_TEST_WORKER": f"w{n}"}, tmp_path / f"worker-{n}.log")
            for n in range(2)
        ]
        started.extend(workers)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda w: w.start(), workers))
        return Durable(merged, Settings.from_env(merged), durable.log, workers[0], durable.broker)

    yield start
    for worker in started:
        worker.stop()


async def run_all(pair: Durable, prompt: str, runs: int) -> list[str]:
    """Start `runs` runs at once and wait until each is done."""
    async with DurableClient(settings=pair.settings) as client:
        ids = await client.start_many("limited", [f"{prompt} {i}" for i in range(runs)])
        results = await asyncio.gather(*(client.result(i, wait=True, timeout=100) for i in ids))
    assert [r.status for r in results] == ["done"] * runs, {r.error for r in results}
    return ids


def assert_each_turn_answered_once(provider: Provider, prompt: str, runs: int) -> None:
    answered = Counter((c.prompt, c.turn) for c in provider.answered(prompt))
    assert len(answered) == 2 * runs, "a turn never reached the provider"
    assert set(answered.values()) == {1}, "a turn called the provider twice"


def assert_both_workers_ran_turns(tmp_path: Path) -> None:
    for n in range(2):
        assert "relayq.run_turn[" in (tmp_path / f"worker-{n}.log").read_text(errors="replace")


def runs_of(pair: Durable, ids: list[str]) -> list[RunRow]:
    db = pair.db()
    try:
        with db.read() as s:
            return list(s.exec(select(RunRow).where(col(RunRow.id).in_(ids))))
    finally:
        db.dispose()


def requeued(pair: Durable, ids: list[str]) -> Counter[str]:
    """How many times each run's turns went back to their queue with a countdown (a retry,
    or a wait for capacity too long to wait in place), as the workers sent them."""
    sent = sent_messages(pair.log, run_ids=set(ids))
    return Counter(str(s.args[0]) for s in sent if s.countdown)


async def test_two_workers_keep_to_requests_per_minute_together(
    two_workers: StartPair, prompt: str, tmp_path: Path
):
    # Given two workers and a provider limited to 300 calls a minute (5 a second)
    provider = Provider()
    with provider.serve() as server:
        pair = two_workers(server, RELAYQ_TEST_RPM="300")

        # When 20 runs (40 calls) start at once
        ids = await run_all(pair, prompt, 20)

    # Then the calls kept to 5 a second
    assert_kept_to(provider.warm(prompt), 5, lambda c: 1)
    assert_each_turn_answered_once(provider, prompt, 20)
    assert_both_workers_ran_turns(tmp_path)
    # ... every turn waited in place (8 s of calls, under RELAYQ_LIMIT_WAIT), none was retried
    assert requeued(pair, ids) == Counter()
    assert {r.crashes for r in runs_of(pair, ids)} == {0}


async def test_two_workers_keep_to_tokens_per_minute_together(
    two_workers: StartPair, prompt: str, tmp_path: Path
):
    # Given two workers and a provider limited to 30,000 tokens a minute (500 a
    # second), whose replies use 100 tokens each, at most max_tokens=90 of them completion
    provider = Provider(tokens=(10, 90))
    with provider.serve() as server:
        pair = two_workers(server, RELAYQ_TEST_TPM="30000", RELAYQ_TEST_MAX_TOKENS="90")

        # When 20 runs (40 calls, 4,000 tokens) start at once
        await run_all(pair, prompt, 20)

    # Then the calls kept to 500 tokens a second
    assert_kept_to(provider.warm(prompt), 500, lambda c: c.tokens)
    assert_each_turn_answered_once(provider, prompt, 20)
    assert_both_workers_ran_turns(tmp_path)


async def test_two_workers_never_hold_more_calls_in_flight_than_the_cap(
    two_workers: StartPair, prompt: str, tmp_path: Path
):
    # Given two workers, at most 3 calls in flight, and a provider that takes 0.2 s a call
    provider = Provider(delay=0.2)
    with provider.serve() as server:
        pair = two_workers(server, RELAYQ_TEST_IN_FLIGHT="3")

        # When 20 runs (40 calls) start at once
        await run_all(pair, prompt, 20)
        peak = server.peak_in_flight

    # Then the server never held more than 3 of them at once
    assert peak <= 3
    assert_each_turn_answered_once(provider, prompt, 20)
    assert_both_workers_ran_turns(tmp_path)


async def test_a_429_with_retry_after_pauses_every_worker_and_no_waiting_turn_is_taken_for_dead(
    two_workers: StartPair, prompt: str, tmp_path: Path
):
    # Given two workers that take a worker for dead after 2 s without a heartbeat and
    # sweep twice a second, one call in flight at a time, and a provider whose first
    # answer is 429 with Retry-After: 4
    provider = Provider()
    provider.refuse.append(error(429, "rate limited", **{"retry-after": "4"}))
    with provider.serve() as server:
        pair = two_workers(
            server,
            RELAYQ_TEST_IN_FLIGHT="1",
            RELAYQ_HEARTBEAT_EVERY="0.5",
            RELAYQ_WORKER_TIMEOUT="2",
            RELAYQ_SWEEP_EVERY="0.5",
        )

        # When 10 runs start at once
        ids = await run_all(pair, prompt, 10)

    # Then no call reached the provider until the 4 s it asked for had passed,
    # though turns waited on both workers (longer than a dead worker's timeout)
    mine = sorted((c for c in provider.calls if c.prompt.startswith(prompt)), key=lambda c: c.at)
    refused = [c for c in mine if c.status == 429]
    assert len(refused) == 1
    after = [c.at - refused[0].at for c in mine if c.at > refused[0].at]
    assert min(after) >= 4.0 - 0.05  # the server's clock against Redis's
    assert_each_turn_answered_once(provider, prompt, 10)
    assert_both_workers_ran_turns(tmp_path)
    # ... only the refused turn was retried (the others waited in place), and no
    # waiting turn was taken over
    refused_run = ids[int(refused[0].prompt.rsplit(" ", 1)[1])]
    assert requeued(pair, ids) == Counter({refused_run: 1})
    assert {r.crashes for r in runs_of(pair, ids)} == {0}


async def test_turns_that_would_wait_too_long_go_back_to_their_queue_and_none_is_lost_or_doubled(
    two_workers: StartPair, prompt: str, tmp_path: Path
):
    # Given two workers whose turns may wait in place only 0.5 s, and 300 calls a minute
    provider = Provider()
    with provider.serve() as server:
        pair = two_workers(server, RELAYQ_TEST_RPM="300", RELAYQ_LIMIT_WAIT="0.5")

        # When 20 runs (40 calls, 8 s of the limit) start at once
        ids = await run_all(pair, prompt, 20)

    # Then turns went back to their queue with a countdown, some more often than a
    # failing call may be retried (RELAYQ_MODEL_RETRIES=2): waiting is not failing ...
    assert max(requeued(pair, ids).values()) > 2
    # ... and each turn reached the provider once, the limit held, no turn was taken over
    assert_each_turn_answered_once(provider, prompt, 20)
    assert_kept_to(provider.warm(prompt), 5, lambda c: 1)
    assert {r.crashes for r in runs_of(pair, ids)} == {0}
