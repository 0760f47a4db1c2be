"""Provider circuits on a real Redis, shared by two clients as by two workers.

A private `redis-server` of this module's own (tests/brokers.py), so a test may
stop it. Each client is a `RedisCircuit` of its own (its own process cache),
on one key prefix: what one opens, the other is kept back by.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable

import pytest

from relayq import InProcessRequest, InProcessResponse, ModelError
from relayq.circuit import CircuitChange, CircuitHooks, CircuitModel, ProviderDown, Ticket
from relayq.ratelimit import ProviderLimits
from tasks import Settings
from tasks.broker.circuit import CircuitLog, RedisCircuit, circuit_for, read_circuits

REQUEST = InProcessRequest(messages=[{"role": "user", "content": "hi"}], tools=[])
LIMITS = ProviderLimits(key="p1", label="api.example.com/m", host="api.example.com", model="m")
PROBE_EVERY = 0.2


class Seen(CircuitHooks):
    def __init__(self) -> None:
        self.changes: list[CircuitChange] = []

    def after_change(self, event: CircuitChange) -> None:
        self.changes.append(event)

    @property
    def states(self) -> list[str]:
        return [c.state for c in self.changes]


class Woken:
    def __init__(self) -> None:
        self.runs: list[str] = []

    async def __call__(self, runs: list[str]) -> None:
        self.runs.extend(runs)


@pytest.fixture
def views(private_redis, prefix):
    """What /metrics and `relayq batch status` read of the circuits under this prefix."""
    client = private_redis.client()
    yield lambda batch_id=None: read_circuits(client, prefix, batch_id=batch_id)
    client.close()


@pytest.fixture
async def pair(private_redis, prefix) -> AsyncIterator[list[tuple[RedisCircuit, Seen, Woken]]]:
    """Two clients of one set of circuits, each with its hooks and its wake-ups."""
    made = []
    for _ in range(2):
        seen, woken = Seen(), Woken()
        circuit = RedisCircuit(
            private_redis.url, prefix=prefix, probe_every=PROBE_EVERY, hooks=[seen], wake=woken
        )
        made.append((circuit, seen, woken))
    yield made
    for circuit, _, _ in made:
        await circuit.aclose()


class Provider:
    """A model that fails with `error` while it is set, and answers otherwise."""

    def __init__(self, error: ModelError | None = None) -> None:
        self.error = error
        self.calls = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self, request: InProcessRequest) -> InProcessResponse:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return InProcessResponse(content="fine")


def unreachable() -> ModelError:
    return ModelError("openai endpoint h unreachable", retryable=True, unanswered="unreachable")


async def take_probe(circuit: RedisCircuit, limits: ProviderLimits = LIMITS) -> Ticket:
    """The probe of an open circuit, once it is due (by Redis's clock), asked for as a
    caller would."""
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        try:
            ticket = await circuit.admit(limits)
        except ProviderDown:
            if asyncio.get_running_loop().time() > deadline:
                pytest.fail("no probe became due")
            await asyncio.sleep(0.02)
            continue
        assert ticket.probe
        return ticket


async def wait_until_probe_due(circuit: RedisCircuit) -> None:
    await circuit.abandon(await take_probe(circuit))


async def until_it_goes(model: CircuitModel) -> InProcessResponse:
    """The reply of `model`'s first call its circuit lets go (each client trusts what it
    read of a circuit a moment, so one kept back may go a little after another closed it);
    ProviderDown if that call fails for an outage."""
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        try:
            return await model(REQUEST)
        except ProviderDown as down:
            if down.called:
                raise  # let go, and failed
            if asyncio.get_running_loop().time() > deadline:
                pytest.fail("the circuit never let the call go")
            await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    "error",
    [
        unreachable(),
        ModelError("h timed out after 20 s", retryable=True, unanswered="timeout"),
        ModelError("h answered 502", retryable=True, status=502),
    ],
    ids=["unreachable", "timeout", "5xx"],
)
async def test_an_outage_error_opens_the_circuit_and_the_other_client_is_kept_back(pair, error):
    (one, seen_one, _), (two, seen_two, _) = pair
    provider = Provider(error)

    # When a call through the first client fails for an outage
    with pytest.raises(ProviderDown) as raised:
        await CircuitModel(provider, one, LIMITS)(REQUEST)

    # Then its turn is told to wait as the next prober, not failed
    assert raised.value.probing
    assert raised.value.called
    assert raised.value.kind is not None
    assert raised.value.error == str(error)
    assert seen_one.states == ["open"]
    # ... and a call through the second client is kept back without reaching the provider
    with pytest.raises(ProviderDown) as kept:
        await CircuitModel(provider, two, LIMITS)(REQUEST)
    assert not kept.value.called
    assert not kept.value.probing
    assert kept.value.opened_at == raised.value.opened_at
    assert provider.calls == 1
    assert seen_two.states == ["open"], "the second client saw it open, once"


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_errors_no_wait_fixes_never_open_the_circuit_and_stand_at_once(pair, status):
    (one, _, _), (two, _, _) = pair
    provider = Provider(ModelError(f"h answered {status}", status=status))

    for circuit in (one, two):
        with pytest.raises(ModelError) as raised:
            await CircuitModel(provider, circuit, LIMITS)(REQUEST)
        assert not isinstance(raised.value, ProviderDown)
        assert raised.value.status == status
    assert provider.calls == 2, "the circuit stayed closed: each call went"


async def test_a_429_leaves_the_circuit_closed(pair):
    (one, seen, _), _ = pair
    provider = Provider(ModelError("h answered 429", retryable=True, status=429))

    with pytest.raises(ModelError) as raised:
        await CircuitModel(provider, one, LIMITS)(REQUEST)

    assert not isinstance(raised.value, ProviderDown)
    assert seen.states == []


async def test_one_probe_at_a_time_across_two_clients_and_its_success_closes_it_for_both(
    pair, views
):
    (one, seen_one, woken_one), (two, seen_two, woken_two) = pair
    provider = Provider(unreachable())
    with pytest.raises(ProviderDown):
        await CircuitModel(provider, one, LIMITS)(REQUEST)
    for run in ("run-a", "run-b"):
        assert await two.waiting(LIMITS.key, run, "batch-1") is not None
    await wait_until_probe_due(one)

    # When the provider is back and both clients call at once, the probe held open
    provider.error, provider.gate = None, asyncio.Event()
    calls = [asyncio.create_task(CircuitModel(provider, c, LIMITS)(REQUEST)) for c in (one, two)]
    done, _ = await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)

    # Then one of them is kept back and one probes
    kept = done.pop()
    assert isinstance(kept.exception(), ProviderDown)
    provider.gate.set()
    replies = await asyncio.gather(*calls, return_exceptions=True)
    assert sum(isinstance(r, InProcessResponse) for r in replies) == 1
    assert provider.calls == 2, "the failed call and the probe"

    # ... the probe's answer closed the circuit: the waiting runs are woken, and both
    # clients' next calls go
    assert sorted(woken_one.runs + woken_two.runs) == ["run-a", "run-b"]
    for circuit in (one, two):
        assert (await until_it_goes(CircuitModel(provider, circuit, LIMITS))).content == "fine"
    assert "closed" in seen_one.states + seen_two.states
    assert views() == []


async def test_a_failed_probe_opens_it_again_until_the_next_probe(pair, views):
    (one, _seen, _), (two, _, _) = pair
    provider = Provider(unreachable())
    with pytest.raises(ProviderDown) as opened:
        await CircuitModel(provider, one, LIMITS)(REQUEST)
    await wait_until_probe_due(two)

    # When the probe fails too
    with pytest.raises(ProviderDown) as probe:
        await CircuitModel(provider, two, LIMITS)(REQUEST)

    # Then its turn is the next prober, the circuit is open since the first failure, and
    # the next call is kept back
    assert probe.value.probing
    assert probe.value.called
    assert probe.value.opened_at == opened.value.opened_at
    with pytest.raises(ProviderDown) as kept:
        await CircuitModel(provider, one, LIMITS)(REQUEST)
    assert not kept.value.called
    assert provider.calls == 2
    [view] = views()
    assert (view.state, view.kind) == ("open", "unreachable")
    assert view.probes == 2, "the probe taken and handed back while waiting, and the failed one"


async def test_a_probe_whose_caller_died_is_taken_over_when_its_lease_runs_out(pair):
    (one, _, _), (two, _, _) = pair
    short = ProviderLimits(key="p2", label="h/m2", host="h", model="m2", lease=0.3)
    provider = Provider(unreachable())
    with pytest.raises(ProviderDown):
        await CircuitModel(provider, one, short)(REQUEST)
    # When the first client takes the probe and never reports back, as a dead worker would
    await take_probe(one, short)

    # Then the other client is kept back while the lease holds, and probes after it
    with pytest.raises(ProviderDown):
        await two.admit(short)
    await take_probe(two, short)
    with pytest.raises(ProviderDown):
        await one.admit(short)  # the probe is the other's now


async def test_a_run_keeps_the_moment_it_began_to_wait_until_the_circuit_closes(pair, views):
    (one, _, woken), (two, _, _) = pair
    assert await one.waiting(LIMITS.key, "run-x", None) is None, "closed: nothing to wait for"
    provider = Provider(unreachable())
    with pytest.raises(ProviderDown):
        await CircuitModel(provider, one, LIMITS)(REQUEST)

    first = await one.waiting(LIMITS.key, "run-x", "batch-9")
    again = await two.waiting(LIMITS.key, "run-x", "batch-9")

    assert first is not None
    assert again is not None
    assert again.since == first.since
    assert await two.still_waiting(LIMITS.key, "run-x")
    [view] = views("batch-9")
    assert (view.waiting, view.batch_since, view.provider) == (1, first.since, LIMITS.label)

    # When a probe answers and the circuit closes
    await one.answered(await take_probe(one))

    # Then the run waits no more, is woken, and the moment is gone with the outage ...
    assert not await two.still_waiting(LIMITS.key, "run-x")
    assert woken.runs == ["run-x"]
    assert await two.waiting(LIMITS.key, "run-x", "batch-9") is None
    assert views("batch-9") == []
    # ... so a wait in the next outage begins at its own moment
    with pytest.raises(ProviderDown):
        await CircuitModel(provider, two, LIMITS)(REQUEST)
    later = await one.waiting(LIMITS.key, "run-x", "batch-9")
    assert later is not None
    assert later.since > first.since


async def test_the_prober_keeps_its_part_across_waits_and_another_run_takes_it_once_it_is_gone(
    pair,
):
    (one, _, _), (two, _, _) = pair
    with pytest.raises(ProviderDown):
        await CircuitModel(Provider(unreachable()), one, LIMITS)(REQUEST)

    # When the run whose turn opened the circuit waits as its prober, and another waits
    told = await one.waiting(LIMITS.key, "run-p", None, probing=True)
    other = await two.waiting(LIMITS.key, "run-o", None)
    again = await one.waiting(LIMITS.key, "run-p", None)

    # Then the prober stays the prober, though kept back before its probe was due
    assert told is not None
    assert told.probing
    assert other is not None
    assert not other.probing
    assert again is not None
    assert again.probing
    # ... and once it has not been seen for three probes' time, the other run takes it on
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        taken = await two.waiting(LIMITS.key, "run-o", None)
        assert taken is not None
        if taken.probing:
            break
        assert asyncio.get_running_loop().time() < deadline, "the prober never went stale"
        await asyncio.sleep(0.05)


async def test_with_redis_unreachable_the_outage_error_stands_with_a_warning(
    private_redis, prefix, caplog
):
    # Given a circuit whose Redis is not there
    circuit = RedisCircuit("redis://127.0.0.1:9/0", prefix=prefix, probe_every=PROBE_EVERY)
    error = unreachable()

    # When a call fails for an outage, Then the error stands, as without a circuit
    with (
        caplog.at_level(logging.WARNING, logger="tasks.broker.circuit"),
        pytest.raises(ModelError) as raised,
    ):
        await CircuitModel(Provider(error), circuit, LIMITS)(REQUEST)
    assert raised.value is error
    assert "provider circuits unavailable" in caplog.text
    await circuit.aclose()


def test_each_process_has_one_circuit_per_broker_and_none_without_redis(tmp_path, private_redis):
    def settings(**env: str) -> Settings:
        return Settings.from_env(
            {"RELAYQ_BROKER_URL": private_redis.url, "RELAYQ_KEY_PREFIX": "a:", **env}
        )

    shared = settings()
    other_broker = settings(RELAYQ_BROKER_URL=private_redis.url.rsplit("/", 1)[0] + "/1")
    other_prefix = settings(RELAYQ_KEY_PREFIX="b:")
    off = settings(RELAYQ_PROVIDER_CIRCUIT="0")
    unstarted = Settings.from_env({"RELAYQ_HOME": str(tmp_path)})

    mine = circuit_for(shared)
    assert isinstance(mine, RedisCircuit)
    assert circuit_for(settings()) is mine, "the same settings, read again"
    on_db_1, under_b = circuit_for(other_broker), circuit_for(other_prefix)
    assert isinstance(on_db_1, RedisCircuit)
    assert isinstance(under_b, RedisCircuit)
    assert len({id(mine), id(on_db_1), id(under_b)}) == 3, "one circuit per broker and prefix"
    assert (on_db_1.url, under_b.prefix) == (other_broker.redis_url, "b:")
    assert not isinstance(circuit_for(off), RedisCircuit), "switched off"
    assert not isinstance(circuit_for(unstarted), RedisCircuit), "no broker running"
    assert in_a_fork(lambda: circuit_for(shared) is not mine), "a forked process has its own"


def in_a_fork(check: Callable[[], bool]) -> bool:
    """`check()` in a forked child of this process (exit status 0 for true)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


async def test_a_worker_logs_one_line_per_change_it_sees(private_redis, prefix, caplog):
    # Given two clients that log the changes they see
    one, two = (
        RedisCircuit(
            private_redis.url, prefix=prefix, probe_every=PROBE_EVERY, hooks=[CircuitLog()]
        )
        for _ in range(2)
    )
    provider = Provider(unreachable())

    # When the first opens the circuit and fails a probe, the second is kept back, and the
    # first's next probe is answered
    with caplog.at_level(logging.INFO, logger="tasks.broker.circuit"):
        try:
            for _ in range(2):
                with pytest.raises(ProviderDown):
                    await until_it_goes(CircuitModel(provider, one, LIMITS))
            with pytest.raises(ProviderDown):
                await CircuitModel(provider, two, LIMITS)(REQUEST)
            provider.error = None
            await until_it_goes(CircuitModel(provider, one, LIMITS))
            await until_it_goes(CircuitModel(provider, two, LIMITS))
        finally:
            await one.aclose()
            await two.aclose()

    # Then each change is one line, the provider named, never more
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.broker.circuit"]
    assert [line.split(":")[0].split(" (")[0] for line in lines] == [
        f"provider {LIMITS.label} is down",  # the first opened it
        f"provider {LIMITS.label}",  # ... probed it
        f"provider {LIMITS.label}",  # ... and its probe failed
        f"provider {LIMITS.label} is down",  # the second saw it open
        f"provider {LIMITS.label}",  # the first probed again
        f"provider {LIMITS.label} answers again",  # ... and closed it
        f"provider {LIMITS.label} answers again",  # the second saw it closed
    ]
    assert "the probe failed (unreachable)" in lines[2]
    assert "open since ?" not in " ".join(lines)
