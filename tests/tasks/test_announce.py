"""Which runs a worker announces, on which channel, and what an announcement holds."""

from __future__ import annotations

import threading

import pytest

from store.requests import run_of_request
from tasks import Settings
from tasks.broker.announce import Announcer, RunAnnouncer, channel_of, decode, encode
from tasks.broker.peek import redis_url
from tasks.hooks import AnswerApplied, RunSettled, TurnOutcome
from tests.ports import free_port


class _Heard:
    def __init__(self) -> None:
        self.run_ids: list[str] = []

    def announce(self, run_ids):
        self.run_ids.extend(run_ids)


def _announcer(runs: dict[str, str] | None = None) -> tuple[RunAnnouncer, _Heard]:
    """A RunAnnouncer whose store knows `runs` (request id -> run id)."""
    known = runs or {}

    async def io(fn, db, request_id):  # the store's answer to `run_of_request`
        assert fn is run_of_request
        return known.get(request_id)

    hook = RunAnnouncer(Settings.load(env={}), None, io)  # type: ignore[arg-type]
    heard = _Heard()
    hook._announcer = heard  # type: ignore[assignment]  # what it would publish
    return hook, heard


@pytest.mark.parametrize("outcome", ["done", "pending", "incomplete", "cancelled", "over_budget"])
def test_a_turn_that_may_have_settled_its_run_settles_it(outcome):
    assert TurnOutcome(outcome).settles


@pytest.mark.parametrize("outcome", ["next", "retry", "waiting", "given_back", "skipped"])
def test_a_turn_that_queued_the_next_one_or_was_sent_again_settles_nothing(outcome):
    # The run is queued again: no waiter is waiting for that.
    assert not TurnOutcome(outcome).settles


async def test_a_settled_run_and_an_applied_answer_s_run_are_announced():
    hook, heard = _announcer({"req_1": "run_2"})
    hook.after_run_settled(RunSettled("run_1", "a", "failed"))
    await hook.after_answer_applied(AnswerApplied("req_1", resumed=False))
    assert heard.run_ids == ["run_1", "run_2"]


async def test_an_answer_to_no_known_request_or_not_applied_names_no_run():
    hook, heard = _announcer({"req_1": "run_2"})
    await hook.after_answer_applied(AnswerApplied("req_9", resumed=False))
    await hook.after_answer_applied(AnswerApplied("req_1", resumed=False, error="StoreUnavailable"))
    assert heard.run_ids == []


def test_an_announcement_is_run_ids_and_nothing_else():
    assert encode(["run_a", "run_b"]) == "run_a run_b"
    assert decode(b"run_a run_b") == ["run_a", "run_b"]
    assert decode("") == []


def test_the_channel_carries_the_key_prefix():
    team_a = Settings.from_env({"RELAYQ_KEY_PREFIX": "team-a:"})
    team_b = Settings.from_env({"RELAYQ_KEY_PREFIX": "team-b:"})
    assert channel_of(team_a) == "team-a:runs"
    assert channel_of(team_a) != channel_of(team_b)


def test_the_embedded_brokers_socket_is_reached_as_redis_py_spells_it(tmp_path):
    embedded = Settings.from_env({"RELAYQ_HOME": str(tmp_path)})
    assert redis_url(embedded) == f"unix://{tmp_path / 'redis.sock'}"
    assert redis_url(Settings.from_env({"RELAYQ_BROKER_URL": "amqp://h//"})) is None


def test_a_failed_announcement_raises_nothing_and_quiets_the_announcer():
    # Given an announcer whose broker refuses connections
    settings = Settings.from_env({"RELAYQ_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"})
    announcer = Announcer(settings)
    try:
        # When it announces, it fails quietly ...
        announcer.announce(["run_1"])
        announcer.published()

        # ... and tries no more for a while: a task is not slowed by a broker that is away
        tries: list[str] = []
        announcer._client.publish = lambda channel, data: tries.append(data)  # type: ignore[union-attr, method-assign]
        announcer.announce(["run_2"])
        announcer.published()
        assert tries == []
    finally:
        announcer.close()


def test_what_is_announced_while_a_publish_is_on_its_way_goes_in_the_next_message():
    # Given an announcer whose first publish is slow (a busy machine)
    settings = Settings.from_env({"RELAYQ_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"})
    announcer = Announcer(settings)
    sent: list[str] = []
    first = threading.Event()
    release = threading.Event()

    def publish(channel: str, data: str) -> None:
        if not sent:
            first.set()
            release.wait(5)
        sent.append(data)

    announcer._client.publish = publish  # type: ignore[union-attr, method-assign]
    try:
        # When runs are announced meanwhile, announcing returns at once each time
        announcer.announce(["run_1"])
        assert first.wait(5)
        announcer.announce(["run_2"])
        announcer.announce(["run_3", "run_4"])
        release.set()
        announcer.published()
    finally:
        announcer.close()

    # Then they went together in the next message, none lost
    assert [decode(m) for m in sent] == [["run_1"], ["run_2", "run_3", "run_4"]]
