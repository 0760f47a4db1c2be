"""Settings from the environment, and the retry backoff they drive."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from relayq.retry import backoff
from tasks import Settings
from tasks.runner.memory import MemoryBound, MiB, rss_bytes
from tasks.settings import MAX_COUNTDOWN
from workers.config import celery_config


def test_with_nothing_set_the_store_is_sqlite_and_the_broker_embedded(tmp_path):
    s = Settings.from_env({"RELAYQ_HOME": str(tmp_path)})
    assert s.database_url == f"sqlite:///{tmp_path / 'relayq.db'}"
    assert s.embedded_broker
    assert s.broker_url == f"redis+socket://{tmp_path / 'redis.sock'}"
    assert s.broker_options()["broker_transport_options"]["global_keyprefix"] == "relayq:"


def test_configured_urls_are_used_as_given():
    s = Settings.from_env(
        {
            "RELAYQ_DATABASE_URL": "postgresql+psycopg://u@h/db",
            "RELAYQ_BROKER_URL": "redis://h:6379/2",
            "RELAYQ_KEY_PREFIX": "team-a:",
        }
    )
    assert (s.database_url, s.broker_url, s.embedded_broker) == (
        "postgresql+psycopg://u@h/db",
        "redis://h:6379/2",
        False,
    )
    assert s.home == Path(".relayq").resolve()


def test_a_turn_time_limit_near_the_visibility_timeout_is_refused():
    with pytest.raises(ValueError, match="visibility timeout"):
        Settings.from_env({"RELAYQ_TURN_TIME_LIMIT": "3500"})


@pytest.mark.parametrize("attempt", range(8))
def test_backoff_doubles_with_jitter_and_stays_below_the_ceiling(attempt):
    delays = [backoff(attempt, None, base=1.0) for _ in range(50)]
    expected = min(60.0, 2.0**attempt)
    assert all(expected * 0.5 <= d <= expected for d in delays)
    assert len(set(delays)) > 1, "jittered"


def test_backoff_waits_at_least_the_servers_retry_after_but_never_past_the_ceiling():
    assert backoff(0, 7.5, base=0.01) >= 7.5
    assert backoff(0, 10_000, base=0.01) == MAX_COUNTDOWN


def test_the_recovery_bounds_default_to_meeting_thirty_seconds_and_can_be_set():
    # Dead worker: timeout + one sweep interval + a turn; lost message: bound + a sweep.
    s = Settings.from_env({}).recovery
    assert (s.heartbeat_every, s.sweep_every) == (timedelta(seconds=2), timedelta(seconds=5))
    assert s.worker_timeout + s.sweep_every < timedelta(seconds=30)
    assert s.redeliver_after + s.sweep_every < timedelta(seconds=30)
    assert s.outbox_grace + s.sweep_every < timedelta(seconds=30)
    assert s.visibility_timeout == timedelta(hours=1)

    custom = Settings.from_env(
        {
            "RELAYQ_HEARTBEAT_EVERY": "1",
            "RELAYQ_WORKER_TIMEOUT": "4",
            "RELAYQ_SWEEP_EVERY": "2",
            "RELAYQ_REDELIVER_AFTER": "7",
            "RELAYQ_OUTBOX_GRACE": "3",
            "RELAYQ_VISIBILITY_TIMEOUT": "7200",
        }
    )
    rec = custom.recovery.bounds()
    assert (rec.worker_timeout.total_seconds(), rec.redeliver_after.total_seconds()) == (4, 7)
    assert rec.outbox_grace.total_seconds() == 3
    seconds = (custom.recovery.sweep_every, custom.recovery.heartbeat_every)
    assert [t.total_seconds() for t in seconds] == [2, 1]
    assert custom.recovery.visibility_timeout == timedelta(hours=2)
    assert custom.broker_options()["broker_transport_options"]["visibility_timeout"] == 7200


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RELAYQ_SWEEP_EVERY": "soon"}, "RELAYQ_SWEEP_EVERY must be a number"),
        ({"RELAYQ_WORKER_TIMEOUT": "0"}, "RELAYQ_WORKER_TIMEOUT must be more than 0"),
        ({"RELAYQ_WORKER_TIMEOUT": "3"}, "at least twice RELAYQ_HEARTBEAT_EVERY"),
        ({"RELAYQ_LOOP_STALL": "30"}, "RELAYQ_LOOP_STALL_EXIT must be longer than"),
        ({"RELAYQ_TOOL_THREADS": "0"}, "RELAYQ_TOOL_THREADS must be a whole number of at least 1"),
    ],
)
def test_a_recovery_setting_that_cannot_work_is_refused(env: dict[str, str], says: str):
    with pytest.raises(ValueError, match=says):
        Settings.from_env(env)


def test_beat_sweeps_as_often_as_the_workers_do():
    from workers.config import celery_config

    config = celery_config(Settings.from_env({"RELAYQ_SWEEP_EVERY": "7"}))
    entry = config["beat_schedule"]["relayq-sweep"]
    assert entry["schedule"] == 7.0
    assert entry["options"]["expires"] == 14.0


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("1w", timedelta(weeks=1)),
        ("3600", timedelta(hours=1)),
        ("off", None),
        ("", None),
    ],
)
def test_retention_reads_an_age_or_off(given, kept):
    assert Settings.from_env({"RELAYQ_RETENTION": given}).recovery.retention == kept


@pytest.mark.parametrize(
    "given", ["soon", "-1d", "30x", "d", "99999999d", "999999999w", "36501d", "99999999999"]
)
def test_a_retention_that_is_no_age_is_refused_naming_the_variable(given):
    with pytest.raises(ValueError, match="RELAYQ_RETENTION must be an age"):
        Settings.from_env({"RELAYQ_RETENTION": given})


@pytest.mark.parametrize("variable", ["RELAYQ_WEBHOOK_RETENTION", "RELAYQ_AUDIT_RETENTION"])
def test_every_age_setting_is_bounded_at_a_century(variable: str):
    assert Settings.from_env({variable: "36500d"}) is not None
    with pytest.raises(ValueError, match=f"{variable} must be an age"):
        Settings.from_env({variable: "99999999d"})


def test_webhook_events_are_kept_a_week_and_the_audit_trail_for_good_unless_told():
    defaults = Settings.from_env({})
    assert defaults.webhooks.retention == timedelta(days=7)
    assert defaults.recovery.audit_retention is None
    told = Settings.from_env({"RELAYQ_WEBHOOK_RETENTION": "off", "RELAYQ_AUDIT_RETENTION": "1w"})
    assert told.webhooks.retention is None
    assert told.recovery.audit_retention == timedelta(weeks=1)
    with pytest.raises(ValueError, match="RELAYQ_AUDIT_RETENTION must be an age"):
        Settings.from_env({"RELAYQ_AUDIT_RETENTION": "forever"})


@pytest.mark.parametrize(
    ("given", "size"),
    [
        ("512MiB", 512 * 2**20),
        ("2GiB", 2 * 2**30),
        ("800MB", 800 * 10**6),
        ("1.5g", int(1.5 * 2**30)),
        ("300", 300 * 2**20),  # a plain number is MiB
        ("off", None),
        ("0", None),
    ],
)
def test_the_worker_memory_bound_reads_a_size_or_off(given: str, size: int | None):
    assert Settings.from_env({"RELAYQ_WORKER_MAX_MEMORY": given}).worker.max_memory == size


@pytest.mark.parametrize("given", ["lots", "-5MiB", "10MiB", "5PB", "512 bananas", "1e9"])
def test_a_worker_memory_bound_that_is_no_size_is_refused_naming_the_variable(given: str):
    with pytest.raises(ValueError, match="RELAYQ_WORKER_MAX_MEMORY must be a size such as"):
        Settings.from_env({"RELAYQ_WORKER_MAX_MEMORY": given})


def test_a_worker_over_its_memory_bound_is_retired_once_with_the_reason():
    retired: list[str] = []
    MemoryBound(rss_bytes() * 4, retired.append).check()
    assert retired == []  # well under
    MemoryBound(16 * MiB, retired.append).check()
    assert len(retired) == 1
    assert retired[0].endswith("is over RELAYQ_WORKER_MAX_MEMORY (16 MiB)")


def test_a_prefork_worker_bounds_its_children_in_kib_and_an_asyncio_one_does_not():
    env = {"RELAYQ_WORKER_MAX_MEMORY": "512MiB"}
    prefork = celery_config(Settings.from_env({**env, "RELAYQ_POOL": "prefork"}))
    assert prefork["worker_max_memory_per_child"] == 512 * 1024
    assert "worker_max_memory_per_child" not in celery_config(Settings.from_env(env))
