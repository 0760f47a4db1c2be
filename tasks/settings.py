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
the deployment's. An empty value counts as unset. In the configuration a duration
may also be a number or a `timedelta`, a count an int, a flag a bool:
`relayq_turn_time_limit = timedelta(minutes=5)`.

The settings come in groups, one per concern (`settings.turns.time_limit`,
`settings.recovery.worker_timeout`, ...); each setting, its default and its
variable are declared once, on its group's field. docs/configuration.md lists
every one (tests/tasks/test_settings_table.py holds the two together).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

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
from tasks.setting_fields import (
    CONF_PREFIX,
    ENV_PREFIX,
    WORKER_BATCHES,
    Option,
    Source,
    age,
    answer_bytes,
    count,
    memory,
    names,
    option,
    read_fields,
    shown_default,
    text,
    worker_batches,
)
from tasks.webhooks.endpoints import Endpoint, WebhookSettings, parse_webhooks

__all__ = [
    "CONF_PREFIX",
    "ENV_PREFIX",
    "MAX_COUNTDOWN",
    "PRIORITY_STEPS",
    "QUEUES",
    "WORKER_BATCHES",
    "Option",
    "ProviderSettings",
    "RecoverySettings",
    "Settings",
    "TurnSettings",
    "WebhookSettings",
    "WorkerSettings",
    "options",
    "queue_named",
]


MAX_COUNTDOWN = MAX_DELAY

# Separate queues: answers and maintenance never wait behind a backlog of
# turns, and each can get its own workers.
QUEUES = (TURN_QUEUE, ANSWER_QUEUE, MAINTENANCE_QUEUE)

PRIORITY_STEPS = (0, 6, 9)
"""The priorities messages go at (`tasks.broker.publish`): 0 for all but a batch's turns,
6 and 9 for those. Kombu's Redis transport keeps a list per step and queue, and a
consumer's every BRPOP names them all: kombu's default steps (0, 3, 6, 9) add a list no
message is ever sent to, a quarter of the keys a worker names per message."""

assert DEFAULT_QUEUE == TURN_QUEUE, "an agent's default queue is the store's turn queue"


def queue_named(name: str) -> Queue:
    """A queue on an exchange of its own, bound by its name: a message reaches that queue only.

    Celery declares a queue it does not know (`-Q relayq.turns.vip`, or a send to
    it) the same way (`task_create_missing_queues`).
    """
    return Queue(name, Exchange(name), routing_key=name)


# -- the groups --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TurnSettings:
    """How long a turn may take, and how often it is tried again."""

    time_limit: timedelta = option("turn_time_limit", default=timedelta(seconds=600))
    """A turn's time: Celery's soft time limit, and each agent's default."""
    model_retries: int = option("model_retries", default=5)
    """Retries of a failing model call before the run fails, unless the agent sets its own."""
    crash_limit: int = option("crash_limit", parse=count(1), default=3)
    """Deaths of a process running the turn alone at which its run fails: a turn that kills
    its worker every time must not take workers down forever. A worker that dies running
    other turns too (a deploy, the OOM killer, another turn's tool) counts no death
    against any of them: they run alone next, where a death tells (`tasks.runner.alone`)."""
    retry_base: timedelta = option("retry_base", default=timedelta(seconds=1))
    """The first retry's backoff; it doubles, up to `MAX_COUNTDOWN`."""


@dataclass(frozen=True, kw_only=True)
class RecoverySettings:
    """How soon a dead worker's runs and a lost message are found and sent on."""

    heartbeat_every: timedelta = option("heartbeat_every", default=timedelta(seconds=2))
    worker_timeout: timedelta = option("worker_timeout", default=timedelta(seconds=10))
    """Without a heartbeat for this long, a worker counts as dead; its claims go to others."""
    sweep_every: timedelta = option("sweep_every", default=timedelta(seconds=5))
    loop_stall: timedelta = option("loop_stall", default=timedelta(seconds=5))
    """A worker's event loop that has not turned for this long is stalled: its heartbeat
    stops, and other workers take its runs (`tasks.runner.loopwatch`)."""
    loop_stall_exit: timedelta = option("loop_stall_exit", default=timedelta(seconds=30))
    """Stalled this long, the worker process ends (exit 70), for its supervisor to start anew."""
    redeliver_after: timedelta = option("redeliver_after", default=timedelta(seconds=10))
    """A sent message's effect overdue by this much, once it left its queue: sent again."""
    outbox_grace: timedelta = option("outbox_grace", default=timedelta(seconds=5))
    """A committed message never marked sent, this long after: sent again."""
    broker_timeout: timedelta = option("broker_timeout", default=timedelta(seconds=10))
    """A broker command's wait for its answer, and a new connection's: past it, the broker
    counts as away (sends are left for the sweeper, a consumer reconnects)."""
    broker_health_check: timedelta = option("broker_health_check", default=timedelta(seconds=10))
    """Between checks of the broker's long-lived connections (the consumer's, pub/sub's): one
    silent (no RST, no FIN) is dropped and made again within about twice this."""
    retention: timedelta | None = option("retention", parse=age, default=None, shown="off")
    """Finished runs unchanged this long are removed by the sweeps, a few each
    (`store.retention`); None keeps them until `relayq purge`."""
    audit_retention: timedelta | None = option(
        "audit_retention", parse=age, default=None, shown="off"
    )
    """The audit trail's decisions older than this are removed by the sweeps; None keeps
    them for good (they outlive their runs: each names its run, request, agent and tool)."""
    visibility_timeout: timedelta = option("visibility_timeout", default=timedelta(seconds=3600))
    """Redis redelivers a maintenance message not acknowledged within it (turn and answer
    messages are held in a worker's memory only, `workers.doorbell`). Recovery does not
    wait for it (the sweeper acts within seconds); every time limit and retry countdown
    stays well below it, or the broker would hand a live task's message out again."""

    def bounds(self) -> Recovery:
        """The sweeper's bounds (`store.Recovery`)."""
        return Recovery(
            worker_timeout=self.worker_timeout,
            outbox_grace=self.outbox_grace,
            redeliver_after=self.redeliver_after,
        )


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """How a worker process runs its turns, and what it tells the world of them."""

    pool: str = option("pool", default="asyncio")
    """`asyncio` (many turns per process), `prefork` or `threads`."""
    concurrency: int | None = option(
        "concurrency", parse=count(1), shown="500 (asyncio), CPUs (others)", default=None
    )
    """Turns one process runs at once; None: the pool's own default."""
    tool_threads: int = option("tool_threads", parse=count(1), default=32)
    """Threads for sync tools' calls at once (the store has threads of its own)."""
    tool_threads_stuck: int = option("tool_threads_stuck", parse=count(1), default=8)
    """Sync tool calls given up on (a timeout) whose threads still run, at which the worker
    retires: it finishes what it holds and ends, for its supervisor to start a new one."""
    alone_processes: int = option("alone_processes", parse=count(1), default=2)
    """Processes an asyncio worker starts, at most, to run suspect turns alone, one each
    at a time (`tasks.runner.alone`): the turns its dead predecessor held beside others."""
    max_memory: int | None = option("worker_max_memory", parse=memory, default=None, shown="off")
    """A worker over this much resident memory retires (`tasks.runner.memory`); a prefork
    worker's children are bounded by it instead (Celery's `worker_max_memory_per_child`)."""
    task_events: bool = option("task_events", default=False)
    """Send Celery task events from the start (Flower turns them on anyway while it runs)."""
    task_log: bool = option("task_log", default=True)
    """Log each task received and finished at INFO, as Celery does; off, a busy worker's
    log keeps what matters (a turn costs a little less CPU, and Flower still shows each)."""
    batches: str = option("worker_batches", parse=worker_batches, default="serve")
    """`serve`: a worker consumes its queues and their active batches' queues; `skip`: never
    a batch's (an interactive-only worker); `only`: its queues' batches' and not the queues."""
    batch_poll: timedelta = option("batch_poll", default=timedelta(seconds=2))
    """Between a worker's looks at the store for the batch queues to consume: a batch's
    first turn may wait that long for a worker."""


@dataclass(frozen=True, kw_only=True)
class ProviderSettings:
    """How turns wait for model providers: their shared limits and their outages."""

    limit_wait: timedelta = option("limit_wait", default=timedelta(seconds=30))
    """What a turn may wait in place (an asyncio sleep) for its provider's shared limits
    (`tasks.broker.limiter`); a longer wait sends it back to its queue with a countdown."""
    outage_limit: timedelta = option("provider_outage_limit", default=timedelta(seconds=3600))
    """What a run may wait for a provider whose circuit is open (`tasks.broker.circuit`)
    before it fails, saying since when the provider has been down."""
    probe_every: timedelta = option("provider_probe_every", default=timedelta(seconds=5))
    """Between probe calls to a provider whose circuit is open (longer when its 5xx asks
    for longer with Retry-After)."""
    circuit: bool = option("provider_circuit", default=True)
    """An unreachable provider, its 5xx and its timeouts open a circuit shared through
    Redis, and turns wait for it without spending tries; off, they spend the retries."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    home: Path = option("home", shown=".relayq", default=Path(".relayq"))
    database_url: str = option(
        "database_url", shown="SQLite (WAL) at `$RELAYQ_HOME/relayq.db`", default=""
    )
    broker_url: str = option(
        "broker_url", shown="the embedded Redis on `$RELAYQ_HOME/redis.sock`", default=""
    )
    embedded_broker: bool = True
    """True when no broker URL was configured: the embedded Redis serves."""
    key_prefix: str = option("key_prefix", default="relayq:")
    agents: str = option("agents", default="")
    """Comma-separated modules that define the agents."""
    hooks: tuple[str, ...] = option("hooks", parse=names, default=())
    """`module:Class` names of the hooks a runtime registers after its own (`tasks.hooks`)."""
    max_answer_bytes: int = option(
        "max_answer_bytes", parse=answer_bytes, default=limits.DEFAULT_MAX_ANSWER_BYTES
    )
    """The largest answer (and prompt) taken, as compact UTF-8 JSON; see `relayq.limits`."""
    mcp_elicit_wait: timedelta = option("mcp_elicit_wait", default=timedelta(minutes=10))
    """How long `relayq mcp` waits for a client's answer to one elicitation (a person's, at
    a form) before the call ends saying what the run waits on."""
    mcp_hold: timedelta = option("mcp_hold", default=timedelta(seconds=20))
    """How long `relayq mcp` holds a call without the tasks extension for its run's next
    moment before it answers with what the run waits on, or a `requestState` to retry
    with: under a proxy's idle timeout."""
    turns: TurnSettings = field(default_factory=TurnSettings)
    recovery: RecoverySettings = field(default_factory=RecoverySettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    providers: ProviderSettings = field(default_factory=ProviderSettings)

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
        src = Source(os.environ if env is None else env, conf)
        found = read_fields(cls, src, skip=("home", "database_url", "broker_url"))
        home = Path(src.value("home", str(cls.home), text)).resolve()
        broker = src.value("broker_url", "", text)
        none: tuple[Endpoint, ...] = ()
        endpoints = src.value("webhooks", none, lambda k, v: parse_webhooks(k, v, src.env))
        settings = cls(
            **found,
            home=home,
            database_url=src.value("database_url", f"sqlite:///{home / 'relayq.db'}", text),
            broker_url=broker or f"redis+socket://{home / 'redis.sock'}",
            embedded_broker=not broker,
            turns=TurnSettings(**read_fields(TurnSettings, src)),
            recovery=RecoverySettings(**read_fields(RecoverySettings, src)),
            worker=WorkerSettings(**read_fields(WorkerSettings, src)),
            webhooks=WebhookSettings(
                **read_fields(WebhookSettings, src, skip=("endpoints",)), endpoints=endpoints
            ),
            providers=ProviderSettings(**read_fields(ProviderSettings, src)),
        )
        settings._check()
        return settings

    def _check(self) -> None:
        turn = self.turns.time_limit.total_seconds()
        visibility = self.recovery.visibility_timeout.total_seconds()
        if turn + 120 >= visibility:
            raise ValueError(
                f"RELAYQ_TURN_TIME_LIMIT must stay well below the broker's visibility "
                f"timeout (RELAYQ_VISIBILITY_TIMEOUT, {visibility:.0f} s)"
            )
        if self.recovery.loop_stall >= self.recovery.loop_stall_exit:
            raise ValueError("RELAYQ_LOOP_STALL_EXIT must be longer than RELAYQ_LOOP_STALL")
        if self.recovery.heartbeat_every * 2 > self.recovery.worker_timeout:
            raise ValueError(
                "RELAYQ_WORKER_TIMEOUT must be at least twice RELAYQ_HEARTBEAT_EVERY, "
                "or a live worker would be taken for dead"
            )

    # -- an agent's policy, with these settings as its defaults -----------------------------------

    def retries_of(self, agent: Agent | None) -> int:
        """Retries of a failing model call for `agent`'s runs (None: an agent not known here)."""
        if agent is None or agent.retries is None:
            return self.turns.model_retries
        return agent.retries

    def time_limit_of(self, agent: Agent) -> float:
        """Seconds one turn of `agent` may take; AgentError if it is not below the worker's.

        The worker's limit is Celery's soft time limit (and the asyncio pool's): an
        agent's own must run out first, for its turn to be retried as a timeout.
        """
        worker = self.turns.time_limit.total_seconds()
        if agent.turn_time_limit is None:
            return worker
        seconds = agent.turn_time_limit.total_seconds()
        if seconds >= worker:
            raise AgentError(
                f"agent {agent.name!r}: turn_time_limit ({seconds:g} s) must stay below "
                f"the worker's RELAYQ_TURN_TIME_LIMIT ({worker:g} s)",
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
                "priority_steps": list(PRIORITY_STEPS),
                "visibility_timeout": self.recovery.visibility_timeout.total_seconds(),
                "global_keyprefix": self.key_prefix,
                # Bounded waits: a broker gone silent is found, never waited on for good.
                "socket_timeout": self.recovery.broker_timeout.total_seconds(),
                "socket_connect_timeout": self.recovery.broker_timeout.total_seconds(),
                "socket_keepalive": True,
                "health_check_interval": int(self.recovery.broker_health_check.total_seconds()),
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


_GROUPS: tuple[tuple[str, type], ...] = (
    ("", Settings),
    ("turns.", TurnSettings),
    ("recovery.", RecoverySettings),
    ("worker.", WorkerSettings),
    ("webhooks.", WebhookSettings),
    ("providers.", ProviderSettings),
)


def options() -> list[Option]:
    """Every setting, in its group's order: the docs' table is held to it."""
    return [
        Option(ENV_PREFIX + f.metadata["option"].upper(), shown_default(f), prefix + f.name)
        for prefix, group in _GROUPS
        for f in fields(group)
        if "option" in f.metadata
    ]
