"""The worker's Celery configuration is deliberate; these are the settings durability rests on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasks import Settings
from tasks.settings import MAX_COUNTDOWN
from tests.workers.celery_tasks import TASKS
from workers.config import celery_config


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    return celery_config(Settings.from_env({"RELAYQ_HOME": str(tmp_path)}))


def test_a_message_is_acknowledged_only_after_its_task_even_when_the_pool_process_dies(
    config: dict[str, Any],
):
    assert config["task_acks_late"] is True
    assert config["task_reject_on_worker_lost"] is True


def test_each_pool_process_reserves_only_the_message_it_runs(config: dict[str, Any]):
    assert config["worker_prefetch_multiplier"] == 1


def test_no_turn_or_retry_countdown_outlasts_the_visibility_timeout(config: dict[str, Any]):
    visibility = config["broker_transport_options"]["visibility_timeout"]
    assert config["task_soft_time_limit"] < config["task_time_limit"]
    assert visibility > config["task_time_limit"]
    assert visibility > MAX_COUNTDOWN


def test_the_three_queues_are_declared_and_every_task_is_routed_to_its_own(
    config: dict[str, Any],
):
    assert {q.name for q in config["task_queues"]} == set(TASKS.values())
    assert {name: route["queue"] for name, route in config["task_routes"].items()} == TASKS


def test_task_events_wait_for_flower_unless_asked_for_from_the_start(config: dict[str, Any]):
    assert config["worker_send_task_events"] is False
    assert config["task_send_sent_event"] is False
    eager = celery_config(Settings.from_env({"RELAYQ_TASK_EVENTS": "1"}))
    assert eager["worker_send_task_events"] is True


def test_the_worker_waits_for_the_broker_forever_and_survives_losing_it(tmp_path: Path):
    config = celery_config(Settings.from_env({"RELAYQ_HOME": str(tmp_path)}))
    assert config["broker_connection_retry"] is True
    assert config["broker_connection_max_retries"] is None
    assert config["worker_consumer"] == "workers.app:Consumer"
    assert config["worker_cancel_long_running_tasks_on_connection_loss"] is True
