"""The answer size limit is one setting, `Settings.max_answer_bytes` (RELAYQ_MAX_ANSWER_BYTES
in the environment or the app's configuration), checked once, where the answer is stored,
whichever door it came by: an answer, a host's leased result."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relayq import RunResult
from relayq.limits import (
    DEFAULT_MAX_ANSWER_BYTES,
    MAX_ANSWER_BYTES_ENV,
    AnswerTooLarge,
    InputTooLarge,
)
from relayq.relay import RelayResult, relay_answer, relay_calls_of
from store import Decider
from tasks import DurableClient, Settings
from tests.durable.hook_agents import hooked_agent

TWO_MIB = 2 * DEFAULT_MAX_ANSWER_BYTES
BETWEEN = "x" * (DEFAULT_MAX_ANSWER_BYTES + DEFAULT_MAX_ANSWER_BYTES // 2)
"""Over the default limit, under the client's."""
HOST = Decider(name="laptop-1", role="host", via="api")


@pytest.fixture
async def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DurableClient]:
    """An eager client whose settings, not the process's environment, raise the limit."""
    monkeypatch.delenv(MAX_ANSWER_BYTES_ENV, raising=False)
    settings = Settings.load(
        env={
            "RELAYQ_HOME": str(tmp_path),
            "RELAYQ_DATABASE_URL": f"sqlite:///{tmp_path / 'relayq.db'}",
            MAX_ANSWER_BYTES_ENV: str(TWO_MIB),
        }
    )
    made = DurableClient(eager=True, settings=settings)
    yield made
    made.close()


async def _waiting(client: DurableClient) -> RunResult:
    first = await client.run(hooked_agent("limited", register=False), "stamp then confirm")
    assert first.status == "pending"
    assert first.pending is not None
    return first


async def test_an_answer_over_the_default_but_within_the_client_s_setting_is_taken(client):
    first = await _waiting(client)
    assert first.pending is not None
    calls = relay_calls_of(first.pending)
    answer = relay_answer(first.pending.id, [RelayResult(id=c.id, output=BETWEEN) for c in calls])

    done = await client.run_with_answer(first.pending, answer, timeout=30)

    assert done.status == "done"


async def test_an_answer_over_the_client_s_setting_is_refused_naming_that_limit(client):
    first = await _waiting(client)
    assert first.pending is not None
    calls = relay_calls_of(first.pending)
    over = "x" * (TWO_MIB + 1)
    answer = relay_answer(first.pending.id, [RelayResult(id=c.id, output=over) for c in calls])

    with pytest.raises(AnswerTooLarge) as refused:
        await client.submit_answer(answer)

    assert refused.value.limit == TWO_MIB
    assert (await client.result(first.run_id)).status == "pending"


async def test_a_leased_result_over_the_default_but_within_the_client_s_setting_is_taken(client):
    first = await _waiting(client)
    [lease] = await client.lease_calls(["confirm"], holder=HOST.name)

    run_id = await client.lease_result(lease.lease_id, output=BETWEEN, host=HOST)

    assert run_id == first.run_id
    assert (await client.result(run_id, wait=True, timeout=30)).status == "done"


async def test_a_leased_result_over_the_client_s_setting_is_refused_naming_that_limit(client):
    first = await _waiting(client)
    [lease] = await client.lease_calls(["confirm"], holder=HOST.name)

    with pytest.raises(AnswerTooLarge) as refused:
        await client.lease_result(lease.lease_id, output="x" * (TWO_MIB + 1), host=HOST)

    assert refused.value.limit == TWO_MIB
    assert (await client.result(first.run_id)).status == "pending"


async def test_a_prompt_over_the_default_but_within_the_client_s_setting_starts_its_run(client):
    agent = hooked_agent("limited", register=False)

    one = await client.start(agent, BETWEEN)
    many = await client.start_many(agent, [BETWEEN])
    batch = await client.start_batch(agent, [("job", BETWEEN)])

    for run_id in [one, *many, *batch.runs.values()]:
        assert (await client.result(run_id)).status != "failed"


async def test_a_prompt_over_the_client_s_setting_starts_nothing_naming_that_limit(client):
    agent = hooked_agent("limited", register=False)
    over = "x" * (TWO_MIB + 1)

    for start in (
        lambda: client.start(agent, over),
        lambda: client.start_many(agent, [over]),
        lambda: client.start_batch(agent, [("job", over)]),
    ):
        with pytest.raises(InputTooLarge) as refused:
            await start()
        assert refused.value.limit == TWO_MIB
    assert await client.runs() == []
