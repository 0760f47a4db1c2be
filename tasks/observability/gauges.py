"""What the store and the broker hold, read when scraped: the API's `/metrics`.

| metric | labels | what |
|---|---|---|
| `relayq_runs` | agent, status | runs in the store |
| `relayq_requests_open` | age | open requests: `<1m`, `1m-10m`, `10m-1h`, `1h-6h`, `6h-1d`, `>1d` |
| `relayq_requests_open_oldest_age_seconds` | | the oldest open request's age (0: none open) |
| `relayq_request_decision_seconds` | agent, outcome | from a request's opening to its answer |
| `relayq_workers_alive` | | worker processes whose heartbeat is current |
| `relayq_queue_depth` | queue | messages waiting per queue (all priorities), active batches' too |
| `relayq_queue_unacked` | | messages workers hold and have not acknowledged (countdowns too) |
| `relayq_provider_circuit` | provider, model, state | 1 for its state: closed, open, half_open |
| `relayq_provider_circuit_open_seconds` | provider, model | how long it has been open (0: closed) |
| `relayq_provider_runs_waiting` | provider, model | runs waiting for the provider to answer again |
| `relayq_store_up`, `relayq_broker_up` | | 1 when the part answered this scrape |
| `relayq_metrics_collect_seconds` | part | what reading `store` and `broker` took |

Providers are named by host and model, those of the agents this process knows
(closed unless Redis says otherwise) and every circuit Redis holds open.

Five statements a scrape, each a count or a sum over an index (the active
batches' queues: over the status index, the unfinished runs only), whatever the
store holds (measured: `tests/durable/test_metrics.py`). Decisions are read as
they come: each scrape reads the decisions made since the one before (by the
audit trail's `at` index, with a minute's overlap for late commits) and adds
their requests' waits to the histogram, so it counts from when this process
first scraped, as any counter counts from its process's start. Every API
process reads the same store: scrape one, or aggregate the store's series with
`max`, not `sum`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta

import redis
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from relayq.circuit import CircuitState
from relayq.ratelimit import ProviderLimits
from store import Database
from store.batch_queues import active_batch_queues
from store.gauges import OpenRequests, decided_since, ping, store_counts
from store.models import utcnow
from store.transitions import STATUSES
from tasks.broker.circuit import CircuitView, read_circuits
from tasks.broker.peek import priority_lists
from tasks.settings import PRIORITY_STEPS, Settings

__all__ = ["AGE_BUCKETS", "DECISION_BUCKETS", "BrokerView", "StoreGauges", "store_answers"]

log = logging.getLogger(__name__)

AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("<1m", 60),
    ("1m-10m", 600),
    ("10m-1h", 3600),
    ("1h-6h", 6 * 3600),
    ("6h-1d", 86400),
)
"""Open requests younger than each bound; the rest are `>1d`."""
OLDEST_BUCKET = ">1d"
DECISION_BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 7200, 4 * 3600, 8 * 3600, 86400, 3 * 86400)
"""Seconds from a request's opening to its answer."""
LOOKBACK = timedelta(minutes=1)
"""How far before the last scrape decisions are read again: a decision's row is stamped
before its transaction commits, and a slow commit must not be missed."""


def store_answers(db: Database) -> None:
    """One `SELECT 1`: raises if the store cannot be reached."""
    ping(db)


class BrokerView:
    """The broker's Redis, read only: queue lengths and a PING; None when it is not Redis."""

    def __init__(self, settings: Settings, *, timeout: float = 2.0) -> None:
        self.prefix = settings.key_prefix
        url = settings.broker_url
        if url.startswith("redis+socket://"):
            url = "unix://" + url.removeprefix("redis+socket://")
        self.client = (
            redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
            if url.startswith(("redis://", "rediss://", "unix://"))
            else None
        )

    def ping(self) -> None:
        """Raises when the broker does not answer."""
        if self.client is not None:
            self.client.ping()

    def depths(self, queues: Sequence[str]) -> tuple[dict[str, int], int] | None:
        """Messages waiting in each queue (all priorities), and those delivered but not
        acknowledged; None when the broker is not Redis."""
        if self.client is None:
            return None
        keys = [[self.prefix + key for key in priority_lists(q)] for q in queues]
        with self.client.pipeline(transaction=False) as pipe:
            for key in (k for per_queue in keys for k in per_queue):
                pipe.llen(key)
            pipe.hlen(self.prefix + "unacked")
            counts = pipe.execute()
        per = len(PRIORITY_STEPS)
        depths = {q: sum(counts[n * per : (n + 1) * per]) for n, q in enumerate(queues)}
        return depths, int(counts[-1])

    def circuits(self) -> list[CircuitView] | None:
        """The provider circuits not closed (`tasks.broker.circuit`); None when it is not Redis."""
        if self.client is None:
            return None
        return read_circuits(self.client, self.prefix)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class _Decisions:
    """The decision histogram, from the decisions read so far (thread-safe through the
    collector's lock)."""

    def __init__(self, since: datetime) -> None:
        self.mark = since
        self.seen: dict[str, datetime] = {}
        """Requests already counted, while a later read may meet them again."""
        self.buckets: dict[tuple[str, str], list[int]] = {}
        self.sums: dict[tuple[str, str], float] = {}

    def read(self, db: Database, now: datetime) -> None:
        since = self.mark - LOOKBACK
        for row in decided_since(db, since):
            if row.request_id in self.seen or row.answered_at is None:
                continue
            self.seen[row.request_id] = row.answered_at
            self._add((row.agent, row.outcome or "answered"), row.answered_at - row.created_at)
        self.mark = now
        self.seen = {k: at for k, at in self.seen.items() if at >= now - 2 * LOOKBACK}

    def _add(self, key: tuple[str, str], waited: timedelta) -> None:
        seconds = max(0.0, waited.total_seconds())
        counts = self.buckets.setdefault(key, [0] * (len(DECISION_BUCKETS) + 1))
        for n, bound in enumerate(DECISION_BUCKETS):
            if seconds <= bound:
                counts[n] += 1
        counts[-1] += 1
        self.sums[key] = self.sums.get(key, 0.0) + seconds

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(
            "relayq_request_decision_seconds",
            "Requests answered, by the time from their opening to their answer",
            labels=["agent", "outcome"],
        )
        for (agent, outcome), counts in sorted(self.buckets.items()):
            bounds = [*(str(float(b)) for b in DECISION_BUCKETS), "+Inf"]
            family.add_metric(
                [agent, outcome],
                list(zip(bounds, counts, strict=True)),
                self.sums[(agent, outcome)],
            )
        return family


class StoreGauges:
    """A prometheus_client collector of the store's and the broker's state, read at each
    scrape (`collect`, blocking: call it from a thread)."""

    def __init__(
        self,
        db: Database,
        broker: BrokerView | None,
        *,
        queues: Callable[[], Sequence[str]],
        worker_timeout: timedelta,
        providers: Callable[[], Sequence[ProviderLimits]] = tuple,
        clock: Callable[[], datetime] = utcnow,
        decisions_since: datetime | None = None,
    ) -> None:
        """`queues` names the queues to measure and `providers` those whose circuits to
        show (both read at each scrape); decisions are counted from `decisions_since`, by
        default from now."""
        self.db = db
        self.broker = broker
        self.queues = queues
        self.providers = providers
        self.worker_timeout = worker_timeout
        self.clock = clock
        self._decisions = _Decisions(decisions_since or clock())
        self._lock = threading.Lock()
        self._batch_queues: list[str] = []
        """The active batches' queues, as the store last said: each batch's backlog is a
        series of its own while the batch is active."""

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._collect()

    def _collect(self) -> Iterable[Metric]:
        timing = GaugeMetricFamily(
            "relayq_metrics_collect_seconds",
            "Seconds this scrape took to read each part",
            labels=["part"],
        )
        started = time.perf_counter()
        store = self._store()
        timing.add_metric(["store"], time.perf_counter() - started)
        started = time.perf_counter()
        broker = self._broker()
        timing.add_metric(["broker"], time.perf_counter() - started)
        return [*store, *broker, timing]

    def _store(self) -> list[Metric]:
        up = GaugeMetricFamily("relayq_store_up", "1 when the store answered this scrape")
        now = self.clock()
        try:
            found = self._read(now)
        except Exception as exc:  # a scrape reports the store down; it never fails
            log.warning("metrics: the store did not answer: %s", type(exc).__name__)
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, *found]

    def _read(self, now: datetime) -> list[Metric]:
        counts = store_counts(
            self.db,
            opened_after=[now - timedelta(seconds=s) for _, s in AGE_BUCKETS],
            alive_since=now - self.worker_timeout,
        )
        self._decisions.read(self.db, now)
        self._batch_queues = active_batch_queues(self.db)
        alive = counts.workers_alive
        return [
            _runs(counts.runs),
            *_open(counts.open, now),
            self._decisions.family(),
            _gauge("relayq_workers_alive", "Worker processes with a current heartbeat", alive),
        ]

    def _broker(self) -> list[Metric]:
        up = GaugeMetricFamily("relayq_broker_up", "1 when the broker answered this scrape")
        if self.broker is None:
            return []
        queues = list(dict.fromkeys([*self.queues(), *self._batch_queues]))
        try:
            found = self.broker.depths(queues)
            circuits = self.broker.circuits()
        except redis.RedisError as exc:
            log.warning("metrics: the broker did not answer: %s", type(exc).__name__)
            up.add_metric([], 0)
            return [up]
        if found is None:
            return []
        depths, unacked = found
        up.add_metric([], 1)
        depth = GaugeMetricFamily(
            "relayq_queue_depth", "Messages waiting in the queue, all priorities", labels=["queue"]
        )
        for queue, count in depths.items():
            depth.add_metric([queue], count)
        held = "Messages delivered to workers and not yet acknowledged (running or counting down)"
        shown = _circuits(self.providers(), circuits or [], time.time())
        return [up, depth, _gauge("relayq_queue_unacked", held, unacked), *shown]


_CIRCUIT_STATES: tuple[CircuitState, ...] = ("closed", "open", "half_open")


def _circuits(
    known: Sequence[ProviderLimits], held: Sequence[CircuitView], now: float
) -> list[GaugeMetricFamily]:
    """Each provider's circuit: those Redis holds open, and the known ones closed."""
    labels = ["provider", "model"]
    state = GaugeMetricFamily(
        "relayq_provider_circuit", "1 for the provider circuit's state", labels=[*labels, "state"]
    )
    opened = GaugeMetricFamily(
        "relayq_provider_circuit_open_seconds",
        "Seconds the provider's circuit has been open (0: closed)",
        labels=labels,
    )
    waiting = GaugeMetricFamily(
        "relayq_provider_runs_waiting", "Runs waiting for the provider to answer", labels=labels
    )
    views = {(v.host, v.model): v for v in held}
    names = sorted({(p.host, p.model) for p in known} | set(views))
    for name in names:
        view = views.get(name)
        for each in _CIRCUIT_STATES:
            current = view.state if view is not None else "closed"
            state.add_metric([*name, each], 1 if each == current else 0)
        opened.add_metric(list(name), max(0.0, now - view.opened_at) if view else 0.0)
        waiting.add_metric(list(name), view.waiting if view else 0)
    return [state, opened, waiting]


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


def _runs(counts: dict[tuple[str, str], int]) -> GaugeMetricFamily:
    """Every status of every agent with runs, 0 included, so no series vanishes."""
    family = GaugeMetricFamily(
        "relayq_runs", "Runs in the store, by agent and status", labels=["agent", "status"]
    )
    for agent in sorted({a for a, _ in counts}):
        statuses = dict.fromkeys(STATUSES, 0) | {s: n for (a, s), n in counts.items() if a == agent}
        for status, count in statuses.items():
            family.add_metric([agent, status], count)
    return family


def _open(found: OpenRequests, now: datetime) -> list[GaugeMetricFamily]:
    family = GaugeMetricFamily("relayq_requests_open", "Open requests, by age", labels=["age"])
    below = 0
    for (label, _), count in zip(AGE_BUCKETS, found.younger, strict=True):
        family.add_metric([label], count - below)
        below = count
    family.add_metric([OLDEST_BUCKET], found.total - below)
    oldest = found.oldest
    age = max(0.0, (now - oldest).total_seconds()) if oldest is not None else 0.0
    return [
        family,
        _gauge(
            "relayq_requests_open_oldest_age_seconds",
            "Seconds the oldest open request has waited (0: none is open)",
            age,
        ),
    ]
