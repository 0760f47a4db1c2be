"""Which runs a finished task announces, on which channel, and what an announcement holds."""

from __future__ import annotations

import pytest

from store.outbox import ANSWER_TASK, CANCEL_TASK, SWEEP_TASK, TURN_TASK
from tasks import Settings
from tasks.announce import Announcer, channel_of, decode, encode, runs_moved
from tasks.broker import redis_url
from tests.ports import free_port


@pytest.mark.parametrize("summary", ["done", "pending", "incomplete", "cancelled"])
def test_a_turn_that_may_have_settled_its_run_is_announced(summary):
    assert runs_moved(TURN_TASK, ["run_1", 3], summary, "SUCCESS") == ["run_1"]


def test_a_failed_turn_and_a_cancel_are_announced():
    assert runs_moved(TURN_TASK, ["run_1", 3], None, "FAILURE") == ["run_1"]
    assert runs_moved(CANCEL_TASK, ["run_1"], "cancelled", "SUCCESS") == ["run_1"]


def test_a_turn_that_queued_the_next_one_or_was_sent_again_is_not_announced():
    # The run is queued again: no waiter is waiting for that.
    assert runs_moved(TURN_TASK, ["run_1", 3], "next", "SUCCESS") == []
    assert runs_moved(TURN_TASK, ["run_1", 3], None, "RETRY") == []


def test_a_sweep_names_no_run():
    assert runs_moved(SWEEP_TASK, [], "sent 0", "SUCCESS") == []
    assert runs_moved(ANSWER_TASK, [], None, "SUCCESS") == []


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

        # ... and tries no more for a while: a task is not slowed by a broker that is away
        tries: list[str] = []
        announcer._client.publish = lambda channel, data: tries.append(data)  # type: ignore[union-attr, method-assign]
        announcer.announce(["run_2"])
        assert tries == []
    finally:
        announcer.close()
