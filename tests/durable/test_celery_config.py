"""The worker's Celery configuration is deliberate; these are the settings durability rests on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tasks import DurableClient, Settings
from tasks.settings import MAX_COUNTDOWN
from tests import forkserver
from workers.config import celery_config

from .conftest import ROOT, Eventually, SpareWorkers

TASKS = {
    "relayq.run_turn": "relayq.turns",
    "relayq.submit_answer": "relayq.answers",
    "relayq.cancel_run": "relayq.maintenance",
    "relayq.sweep": "relayq.maintenance",
    "relayq.wake_runs": "relayq.maintenance",
}


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


def test_the_tasks_are_routed_by_the_config_alone_with_no_deprecated_task_attribute():
    # A task's own `queue=` is deprecated: Celery 5.7 warns as the task binds to an app,
    # wherever that happens first (a test's lane met it importing tasks.host.eager). A fresh
    # process binds every task, with Celery's deprecation warnings as errors.
    modules = ", ".join(f"tasks.{m}" for m in ("turns", "answers", "maintenance", "host.eager"))
    bind = (
        "import warnings; from celery.exceptions import CDeprecationWarning; "
        "warnings.simplefilter('error', CDeprecationWarning); "
        f"import {modules}; from celery import Celery; Celery().finalize()"
    )
    done = forkserver.run(
        [sys.executable, "-c", bind],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def test_task_events_wait_for_flower_unless_asked_for_from_the_start(config: dict[str, Any]):
    assert config["worker_send_task_events"] is False
    assert config["task_send_sent_event"] is False
    eager = celery_config(Settings.from_env({"RELAYQ_TASK_EVENTS": "1"}))
    assert eager["worker_send_task_events"] is True


async def test_the_running_worker_registers_exactly_the_five_relayq_tasks(client: DurableClient):
    replies = client.app.control.inspect(timeout=10, limit=1).registered()

    assert replies is not None, "the worker answered"
    ((_, names),) = replies.items()
    assert sorted(names) == sorted(TASKS)


async def test_a_worker_told_not_to_log_each_task_logs_no_line_per_task(
    spare_workers: SpareWorkers, prompt: str, eventually: Eventually
):
    # Given a worker with RELAYQ_TASK_LOG=0 and one as Celery logs by default
    quiet = spare_workers.start(RELAYQ_TASK_LOG="0")
    chatty = spare_workers.start()

    # When each runs a turn
    for spare in (quiet, chatty):
        async with DurableClient(settings=spare.settings) as client:
            result = await client.run("recall", prompt, timeout=60)
        assert result.status == "done"

    # Then only the default one logged the task's arrival and its end (Celery logs the
    # end after the task has returned, so after the run is seen done)
    def chatty_log() -> str:
        return chatty.worker.logfile.read_text(errors="replace")

    await eventually(lambda: "succeeded in" in chatty_log(), what="Celery to log the task's end")
    assert "relayq.run_turn[" in chatty_log()
    quiet_log = quiet.worker.logfile.read_text(errors="replace")
    assert "ready." in quiet_log  # the worker's own lines stay
    assert "relayq.run_turn[" not in quiet_log
