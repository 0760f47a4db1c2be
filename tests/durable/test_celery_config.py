"""The worker's Celery configuration as processes see it: every task bound with no deprecated
attribute, the running worker's tasks, and its task log (the settings durability rests on,
read from the configuration itself: tests/workers/test_config.py)."""

from __future__ import annotations

import sys

from tasks import DurableClient
from tests import forkserver
from tests.workers.celery_tasks import TASKS

from .conftest import ROOT, Eventually, SpareWorkers


def test_the_tasks_are_routed_by_the_config_alone_with_no_deprecated_task_attribute():
    # A task's own `queue=` is deprecated: Celery 5.7 warns as the task binds to an app,
    # wherever that happens first (a test's lane met it importing tasks.client.eager). A fresh
    # process binds every task, with Celery's deprecation warnings as errors.
    modules = ", ".join(
        f"tasks.{m}"
        for m in ("runner.turn.task", "runner.turn.answers", "runner.maintenance", "client.eager")
    )
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
