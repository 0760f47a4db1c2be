"""Which runs a worker announces, on which channel, and what an announcement holds."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from store.requests import run_of_request
from tasks import Settings
from tasks.broker.announce import HELD_AT_MOST, Announcer, RunAnnouncer, channel_of, decode, encode
from tasks.hooks import AnswerApplied, RunSettled, TurnOutcome
from tasks.storeio import StoreCalls, StoreDoor
from tests.ports import free_port


class _Heard:
    def __init__(self) -> None:
        self.run_ids: list[str] = []

    def announce(self, run_ids):
        self.run_ids.extend(run_ids)


def _announcer(runs: dict[str, str] | None = None) -> tuple[RunAnnouncer, _Heard]:
    """A RunAnnouncer whose store knows `runs` (request id -> run id)."""
    known = runs or {}

    class Calls(StoreCalls):
        async def __call__(self, fn, db, request_id):  # type: ignore[override]
            assert fn is run_of_request  # the store's answer to `run_of_request`
            return known.get(request_id)

    door = StoreDoor(None, Calls(inline=True, executor=lambda: None))  # type: ignore[arg-type]
    hook = RunAnnouncer(Settings.load(env={}), door)
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
    assert embedded.redis_url == f"unix://{tmp_path / 'redis.sock'}"
    assert Settings.from_env({"RELAYQ_BROKER_URL": "amqp://h//"}).redis_url is None


def _unreachable() -> Settings:
    return Settings.from_env({"RELAYQ_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"})


def test_a_failed_announcement_raises_nothing_and_is_tried_again_with_what_came_since():
    # Given an announcer whose broker fails its first publish (away, or stalled)
    announcer = Announcer(_unreachable(), quiet=0.3)
    sent: list[list[str]] = []
    tries: list[float] = []
    delivered = threading.Event()

    def publish(channel: str, data: str) -> None:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise redis.ConnectionError("the broker is away")
        sent.append(decode(data))
        delivered.set()

    announcer._client.publish = publish  # type: ignore[union-attr, method-assign]
    try:
        # When it announces, it fails quietly, and runs announced meanwhile wait with it
        announcer.announce(["run_1"])
        announcer.announce(["run_2", "run_1"])

        # Then after its quiet spell, and not before, one message names each run once
        assert delivered.wait(5)
        announcer.published()
    finally:
        announcer.close()
    assert sent == [["run_1", "run_2"]]
    assert tries[1] - tries[0] >= 0.3


def _refuse(channel: str, data: str) -> None:
    raise redis.ConnectionError("the broker is away")


def test_a_closed_announcer_tries_once_more_and_never_again():
    # Given an announcer whose broker refuses every publish
    announcer = Announcer(_unreachable(), quiet=60)
    tries: list[str] = []
    failed = threading.Event()

    def publish(channel: str, data: str) -> None:
        tries.append(data)
        failed.set()
        raise redis.ConnectionError("the broker is away")

    announcer._client.publish = publish  # type: ignore[union-attr, method-assign]
    announcer.announce(["run_1"])
    assert failed.wait(5)

    # When it is closed in its quiet spell, it stops at once, dropping what it held
    announcer.close()
    announcer._thread.join(5)
    assert not announcer._thread.is_alive()
    assert tries == ["run_1"]


def test_an_announcer_holds_the_newest_run_ids_while_it_cannot_publish():
    # Given an announcer that cannot publish, and more runs announced than it holds
    announcer = Announcer(_unreachable(), quiet=60)
    announcer._client.publish = _refuse  # type: ignore[union-attr, method-assign]
    try:
        announcer.announce([f"run_{n}" for n in range(HELD_AT_MOST + 50)])
        # Then it keeps the newest; the oldest are left to their waiters' fallback poll
        with pytest.raises(TimeoutError):
            announcer.published(timeout=0.2)
        held = list(announcer._pending)
    finally:
        announcer.close()
    assert len(held) == HELD_AT_MOST
    assert held[-1] == f"run_{HELD_AT_MOST + 49}"


def test_what_is_announced_while_a_publish_is_on_its_way_goes_in_the_next_message():
    # Given an announcer whose first publish is slow (a busy machine)
    announcer = Announcer(_unreachable())
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
