"""What every process that talks to the store or the broker is configured with.

Each setting is read from, first to last:

1. an explicit keyword (`DurableClient(database_url=...)`);
2. the environment, `RELAYQ_<NAME>`;
3. the Celery app's configuration, `relayq_<name>` (lowercase, like Celery's own
   settings): a config module (`CELERY_CONFIG_MODULE=myconfig`,
   `app.config_from_object("myconfig")`) or `app.conf.update(...)`;
4. the default.

The environment beats the configuration as Celery's own `CELERY_BROKER_URL`
beats `broker_url`: the config module ships with the code, the environment is
the deployment's. An empty value counts as unset.

| variable | default | meaning |
|---|---|---|
| `RELAYQ_HOME` | `.relayq` | folder for the SQLite database and the embedded broker |
| `RELAYQ_DATABASE_URL` | SQLite at `$RELAYQ_HOME/relayq.db` | `postgresql+psycopg://...` |
| `RELAYQ_SQLITE_BUSY_TIMEOUT` | `30` | seconds a SQLite write waits for the lock (`store.db`) |
| `RELAYQ_BROKER_URL` | the embedded Redis on `$RELAYQ_HOME/redis.sock` | the Celery broker |
| `RELAYQ_KEY_PREFIX` | `relayq:` | prefix of every broker key, so relayq can share a Redis |
| `RELAYQ_AGENTS` | (none) | comma-separated modules that define the agents |
| `RELAYQ_HOOKS` | (none) | comma-separated `module:Class` hooks of every run (`tasks.hooks`) |
| `RELAYQ_TURN_TIME_LIMIT` | `600` | seconds one turn may take before it is stopped |
| `RELAYQ_MODEL_RETRIES` | `5` | retries of a failing model call before the run fails |
| `RELAYQ_CRASH_LIMIT` | `10` | worker deaths one turn survives before its run fails |
| `RELAYQ_RETRY_BASE` | `1.0` | first retry's backoff in seconds; doubles, up to 60 |
| `RELAYQ_HEARTBEAT_EVERY` | `2` | seconds between a worker process's heartbeats |
| `RELAYQ_WORKER_TIMEOUT` | `10` | seconds without a heartbeat before a worker counts as dead |
| `RELAYQ_SWEEP_EVERY` | `5` | seconds between each worker's sweeps (beat sweeps as often) |
| `RELAYQ_REDELIVER_AFTER` | `10` | seconds before a lost message (effect overdue) is sent again |
| `RELAYQ_OUTBOX_GRACE` | `5` | seconds before a committed message never marked sent is sent again |
| `RELAYQ_VISIBILITY_TIMEOUT` | `3600` | the Redis broker's redelivery of unacknowledged messages |
| `RELAYQ_POOL` | `asyncio` | `asyncio` (many turns per process), `prefork`, `threads` |
| `RELAYQ_CONCURRENCY` | 500 (asyncio), CPUs (others) | turns one worker process runs at once |
| `RELAYQ_TASK_EVENTS` | `0` | `1`: task events from the start, not once Flower asks |
| `RELAYQ_MAX_ANSWER_BYTES` | `1048576` | largest answer (or prompt) taken, in bytes of JSON |
| `RELAYQ_WEBHOOKS` | (none) | JSON list of webhook endpoints: name, url, secret, format, events |
| `RELAYQ_PUBLIC_URL` | `http://127.0.0.1:8000` | the API's address, for the links webhooks carry |
| `RELAYQ_WEBHOOK_ATTEMPTS` | `40` | attempts of one webhook delivery before it is given up |
| `RELAYQ_WEBHOOK_RETRY_BASE` | `1.0` | first backoff of a delivery in seconds; doubles, up to 1 h |
| `RELAYQ_WEBHOOK_TIMEOUT` | `10` | seconds one webhook attempt may take |
| `RELAYQ_WEBHOOK_CONCURRENCY` | `16` | webhook requests in flight at once per worker process |
| `RELAYQ_LIMIT_WAIT` | `30` | seconds a turn waits in place for provider limits, else re-queued |
| `RELAYQ_PROVIDER_OUTAGE_LIMIT` | `3600` | seconds a run waits for a provider that is down |
| `RELAYQ_PROVIDER_PROBE_EVERY` | `5` | seconds between probe calls to a provider that is down |
| `RELAYQ_PROVIDER_CIRCUIT` | `1` | `0`: no circuit; outage errors spend the run's retries |
| `RELAYQ_WORKER_BATCHES` | `serve` | the `-Q` queues' batches: `serve` them too, `skip`, `only` |
| `RELAYQ_BATCH_POLL` | `2` | seconds between a worker's looks at the store for active batches |

In the configuration a duration may also be a number or a `timedelta`, a count
an int, a flag a bool: `relayq_turn_time_limit = timedelta(minutes=5)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from kombu import Exchange, Queue

from relayq import limits
from relayq.agents import DEFAULT_QUEUE, Agent, AgentError
from relayq.retry import MAX_DELAY
from store import Recovery
from store.batch_queues import BATCH_MARK, is_batch_queue
from store.outbox import (
    ANSWER_QUEUE,
    ANSWER_TASK,
    CANCEL_TASK,
    MAINTENANCE_QUEUE,
    SWEEP_TASK,
    TURN_QUEUE,
    TURN_TASK,
    WAKE_TASK,
)
from tasks.hooks import RunHooks
from tasks.webhooks.endpoints import (
    DEFAULT_PUBLIC_URL,
    Endpoint,
    parse_public_url,
    parse_webhooks,
)

__all__ = [
    "CONF_PREFIX",
    "ENV_PREFIX",
    "MAX_COUNTDOWN",
    "QUEUES",
    "WORKER_BATCHES",
    "Settings",
    "queue_named",
]

ENV_PREFIX = "RELAYQ_"
CONF_PREFIX = "relayq_"

MAX_COUNTDOWN = MAX_DELAY

# Separate queues: answers and maintenance never wait behind a backlog of
# turns, and each can get its own workers.
QUEUES = (TURN_QUEUE, ANSWER_QUEUE, MAINTENANCE_QUEUE)

assert DEFAULT_QUEUE == TURN_QUEUE, "an agent's default queue is the store's turn queue"

T = TypeVar("T")


def queue_named(name: str) -> Queue:
    """A queue on an exchange of its own, bound by its name: a message reaches that queue only.

    Celery declares a queue it does not know (`-Q relayq.turns.vip`, or a send to
    it) the same way (`task_create_missing_queues`).
    """
    return Queue(name, Exchange(name), routing_key=name)


class _Source:
    """One setting's raw value: the environment's, else the configuration's, else None."""

    def __init__(self, env: Mapping[str, str], conf: Mapping[str, Any] | None) -> None:
        self.env = env
        self.conf = conf if conf is not None else {}

    def raw(self, name: str) -> tuple[str, Any] | None:
        """(where it was found, the value), for `name` like `turn_time_limit`."""
        key = ENV_PREFIX + name.upper()
        value: Any = self.env.get(key)
        if value is not None and value != "":
            return key, value
        key = CONF_PREFIX + name
        value = self.conf.get(key)
        if value is not None and value != "":
            return key, value
        return None

    def read(self, name: str, default: T, parse: Callable[[str, Any], T]) -> T:
        found = self.raw(name)
        return default if found is None else parse(*found)

    def text(self, name: str, default: str) -> str:
        return self.read(name, default, lambda _, v: str(v))

    def seconds(self, name: str, default: float) -> float:
        return self.read(name, float(default), _seconds)

    def count(self, name: str, default: int) -> int:
        return self.read(name, default, _count(0))

    def flag(self, name: str, default: bool = False) -> bool:
        def parse(_: str, value: Any) -> bool:
            if isinstance(value, bool):
                return value
            return str(value).strip().lower() in ("1", "true", "yes", "on")

        return self.read(name, default, parse)


def _count(minimum: int) -> Callable[[str, Any], int]:
    def parse(key: str, value: Any) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a whole number, not {value!r}") from None
        if isinstance(value, bool | float) or number < minimum:
            raise ValueError(f"{key} must be a whole number of at least {minimum}, not {value!r}")
        return number

    return parse


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a number of seconds, not {value!r}") from None
    if seconds <= 0:
        raise ValueError(f"{key} must be more than 0 seconds, not {value!r}")
    return seconds


WORKER_BATCHES = ("serve", "skip", "only")
"""What a worker does with the batch queues (`store.batch_queues`) of the queues it is told
to consume (`-Q`): consume them beside those queues, never, or instead of those queues."""


def _worker_batches(key: str, value: Any) -> str:
    mode = str(value).strip().lower()
    if mode not in WORKER_BATCHES:
        raise ValueError(f"{key} must be serve, skip or only, not {value!r}")
    return mode


@dataclass(frozen=True, kw_only=True)
class Settings:
    home: Path
    database_url: str
    broker_url: str
    embedded_broker: bool
    """True when no broker URL was configured: the embedded Redis serves."""
    key_prefix: str
    agents: str
    hooks: tuple[str, ...] = ()
    """`module:Class` names of the hooks a runtime registers after its own (`tasks.hooks`)."""
    turn_time_limit: float
    """Seconds a turn may take: Celery's soft time limit, and each agent's default."""
    model_retries: int
    """Retries of a failing model call before the run fails, unless the agent sets its own."""
    crash_limit: int
    """Times a turn is taken over from a dead worker before its run fails: a turn that
    kills its worker every time must not take workers down forever, and a worker
    killed for other reasons (a deploy, the OOM killer) must not fail the runs it held."""
    retry_base: float
    pool: str
    concurrency: int | None
    heartbeat_every: float
    worker_timeout_seconds: float
    sweep_every: float
    redeliver_after_seconds: float
    outbox_grace_seconds: float
    visibility_timeout: float
    """Redis redelivers a message not acknowledged within it. Recovery does not wait
    for it (the sweeper acts within seconds); every time limit and retry countdown
    stays well below it, or the broker would hand a live turn's message out again."""
    task_events: bool
    """Send Celery task events from the start (Flower turns them on anyway while it runs)."""
    task_log: bool = True
    """Log each task received and finished at INFO, as Celery does; off, a busy worker's
    log keeps what matters (a turn costs a little less CPU, and Flower still shows each)."""
    max_answer_bytes: int = limits.DEFAULT_MAX_ANSWER_BYTES
    """The largest answer (and prompt) taken, as compact UTF-8 JSON; see `relayq.limits`."""
    webhooks: tuple[Endpoint, ...] = ()
    """Where events are sent (`tasks.webhooks.sender`); their repr shows no URL or secret."""
    public_url: str = DEFAULT_PUBLIC_URL
    """Where people reach the API and its inbox: the base of the links webhooks carry."""
    webhook_attempts: int = 40
    """Attempts of one delivery before it is given up (`failed`)."""
    webhook_retry_base: float = 1.0
    """Seconds before a failed delivery's second attempt; doubles, up to an hour."""
    webhook_timeout: float = 10.0
    """Seconds one attempt may take, from connecting to the reply's status."""
    webhook_concurrency: int = 16
    """Webhook requests in flight at once, per worker process."""
    limit_wait: float = 30.0
    """Seconds a turn may wait in place (an asyncio sleep) for its provider's shared limits
    (`tasks.broker.limiter`); a longer wait sends it back to its queue with a countdown."""
    provider_outage_limit: float = 3600.0
    """Seconds a run may wait for a provider whose circuit is open (`tasks.broker.circuit`) before
    it fails, saying since when the provider has been down."""
    provider_probe_every: float = 5.0
    """Seconds between probe calls to a provider whose circuit is open (longer when its
    5xx asks for longer with Retry-After)."""
    provider_circuit: bool = True
    """An unreachable provider, its 5xx and its timeouts open a circuit shared through
    Redis, and turns wait for it without spending tries; off, they spend the retries."""
    worker_batches: str = "serve"
    """`serve`: a worker consumes its queues and their active batches' queues; `skip`: never
    a batch's (an interactive-only worker); `only`: its queues' batches' and not the queues."""
    batch_poll: float = 2.0
    """Seconds between a worker's looks at the store for the batch queues to consume: a
    batch's first turn may wait that long for a worker."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings from the environment alone (`os.environ` by default)."""
        return cls.load(env=env)

    @classmethod
    def load(
        cls, env: Mapping[str, str] | None = None, conf: Mapping[str, Any] | None = None
    ) -> Settings:
        """The settings from the environment, then a Celery app's configuration.

        For a config module holding `relayq_database_url = "..."` and the like:

            app = Celery("myapp")
            app.config_from_object("myconfig")
            settings = Settings.load(conf=app.conf)
        """
        src = _Source(os.environ if env is None else env, conf)
        home = Path(src.text("home", ".relayq")).resolve()
        broker = src.text("broker_url", "")
        settings = cls(
            home=home,
            database_url=src.text("database_url", f"sqlite:///{home / 'relayq.db'}"),
            broker_url=broker or f"redis+socket://{home / 'redis.sock'}",
            embedded_broker=not broker,
            key_prefix=src.text("key_prefix", "relayq:"),
            agents=src.text("agents", ""),
            hooks=tuple(n.strip() for n in src.text("hooks", "").split(",") if n.strip()),
            turn_time_limit=src.seconds("turn_time_limit", 600),
            model_retries=src.count("model_retries", 5),
            crash_limit=src.count("crash_limit", 10),
            retry_base=src.seconds("retry_base", 1.0),
            pool=src.text("pool", "asyncio"),
            concurrency=src.read("concurrency", None, _count(1)),
            heartbeat_every=src.seconds("heartbeat_every", 2),
            worker_timeout_seconds=src.seconds("worker_timeout", 10),
            sweep_every=src.seconds("sweep_every", 5),
            redeliver_after_seconds=src.seconds("redeliver_after", 10),
            outbox_grace_seconds=src.seconds("outbox_grace", 5),
            visibility_timeout=src.seconds("visibility_timeout", 3600),
            task_events=src.flag("task_events"),
            task_log=src.flag("task_log", True),
            max_answer_bytes=src.read(
                "max_answer_bytes",
                limits.DEFAULT_MAX_ANSWER_BYTES,
                lambda _, v: limits.max_answer_bytes({limits.MAX_ANSWER_BYTES_ENV: str(v)}),
            ),
            webhooks=src.read("webhooks", (), lambda k, v: parse_webhooks(k, v, src.env)),
            public_url=src.read("public_url", DEFAULT_PUBLIC_URL, parse_public_url),
            webhook_attempts=src.read("webhook_attempts", 40, _count(1)),
            webhook_retry_base=src.seconds("webhook_retry_base", 1.0),
            webhook_timeout=src.seconds("webhook_timeout", 10),
            webhook_concurrency=src.read("webhook_concurrency", 16, _count(1)),
            limit_wait=src.seconds("limit_wait", 30),
            provider_outage_limit=src.seconds("provider_outage_limit", 3600),
            provider_probe_every=src.seconds("provider_probe_every", 5),
            provider_circuit=src.flag("provider_circuit", True),
            worker_batches=src.read("worker_batches", "serve", _worker_batches),
            batch_poll=src.seconds("batch_poll", 2),
        )
        settings._check()
        return settings

    def _check(self) -> None:
        if self.turn_time_limit + 120 >= self.visibility_timeout:
            raise ValueError(
                f"RELAYQ_TURN_TIME_LIMIT must stay well below the broker's visibility "
                f"timeout (RELAYQ_VISIBILITY_TIMEOUT, {self.visibility_timeout:.0f} s)"
            )
        if self.heartbeat_every * 2 > self.worker_timeout_seconds:
            raise ValueError(
                "RELAYQ_WORKER_TIMEOUT must be at least twice RELAYQ_HEARTBEAT_EVERY, "
                "or a live worker would be taken for dead"
            )

    # -- an agent's policy, with these settings as its defaults -----------------------------------

    def retries_of(self, agent: Agent | None) -> int:
        """Retries of a failing model call for `agent`'s runs (None: an agent not known here)."""
        if agent is None or agent.retries is None:
            return self.model_retries
        return agent.retries

    def time_limit_of(self, agent: Agent) -> float:
        """Seconds one turn of `agent` may take; AgentError if it is not below the worker's.

        The worker's limit is Celery's soft time limit (and the asyncio pool's): an
        agent's own must run out first, for its turn to be retried as a timeout.
        """
        if agent.turn_time_limit is None:
            return self.turn_time_limit
        seconds = agent.turn_time_limit.total_seconds()
        if seconds >= self.turn_time_limit:
            raise AgentError(
                f"agent {agent.name!r}: turn_time_limit ({seconds:g} s) must stay below "
                f"the worker's RELAYQ_TURN_TIME_LIMIT ({self.turn_time_limit:g} s)",
                agent.name,
            )
        return seconds

    def check_agent(self, agent: Agent) -> None:
        """AgentError if `agent`'s policy does not fit a worker with these settings."""
        self.time_limit_of(agent)
        for hook in agent.hooks:
            if not isinstance(hook, RunHooks):
                raise AgentError(
                    f"agent {agent.name!r}: hook {hook!r} is not a RunHooks (tasks.hooks)",
                    agent.name,
                )
        if is_batch_queue(agent.queue):
            # Its turns would be sent at a batch's low priority, and consumed as a batch's.
            raise AgentError(
                f"agent {agent.name!r}: queue {agent.queue!r} holds {BATCH_MARK!r}, which "
                "names batch queues; choose another name",
                agent.name,
            )

    @property
    def worker_timeout(self) -> timedelta:
        return timedelta(seconds=self.worker_timeout_seconds)

    def recovery(self) -> Recovery:
        """The sweeper's bounds, from these settings."""
        return Recovery(
            worker_timeout=self.worker_timeout,
            outbox_grace=timedelta(seconds=self.outbox_grace_seconds),
            redeliver_after=timedelta(seconds=self.redeliver_after_seconds),
        )

    @property
    def redis_url(self) -> str | None:
        """The broker's Redis, as redis-py names it; None when the broker is not Redis."""
        url = self.broker_url
        if url.startswith("redis+socket://"):
            return "unix://" + url.removeprefix("redis+socket://")
        if url.startswith(("redis://", "rediss://", "unix://")):
            return url
        return None

    @property
    def socket_path(self) -> Path:
        return self.home / "redis.sock"

    def broker_options(self) -> dict[str, Any]:
        """Celery settings every process needs to reach the broker the same way."""
        return {
            "broker_url": self.broker_url,
            "broker_connection_retry_on_startup": True,
            "broker_transport_options": {
                "visibility_timeout": self.visibility_timeout,
                "global_keyprefix": self.key_prefix,
            },
            # Each queue on its own exchange and key: a message reaches one queue only.
            "task_queues": tuple(queue_named(q) for q in QUEUES),
            # An agent's own queue (`Agent(queue=...)`) is declared the same way by
            # whoever meets it first: a worker told to consume it, or a send to it.
            "task_create_missing_queues": True,
            "task_default_queue": TURN_QUEUE,
            "task_routes": {
                TURN_TASK: {"queue": TURN_QUEUE},
                ANSWER_TASK: {"queue": ANSWER_QUEUE},
                CANCEL_TASK: {"queue": MAINTENANCE_QUEUE},
                SWEEP_TASK: {"queue": MAINTENANCE_QUEUE},
                WAKE_TASK: {"queue": MAINTENANCE_QUEUE},
            },
            "task_serializer": "json",
            "accept_content": ["json"],
            "task_ignore_result": True,
            "result_backend": None,
        }
