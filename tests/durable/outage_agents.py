"""Agents for the broker-outage tests (`RELAYQ_AGENTS=tests.durable.outage_agents`).

A turn that stays in flight until the test lets it go, so a worker holds it
while the broker goes away under it. With `RELAYQ_TEST_CELERYS_CONSUMER=1` the
worker that loads this module releases a lost connection as Celery alone does.
"""

from __future__ import annotations

import asyncio
import os
import time

from relayq import Agent, InProcessRequest, InProcessResponse

from .agents import log_dir, note, prompt_of

HOLD_AT_MOST = 55.0
"""Seconds a held turn waits for its release before it ends anyway."""


def release(prompt: str) -> None:
    """Let the held turn of the run started with `prompt` finish."""
    (log_dir() / f"release-{prompt}").touch()


async def held_model(req: InProcessRequest) -> InProcessResponse:
    prompt = prompt_of(req)
    note("model", prompt)
    gate = log_dir() / f"release-{prompt}"
    deadline = time.monotonic() + HOLD_AT_MOST
    # The release is a file from another process: polled, not an asyncio.Event.
    while not gate.exists() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    note("model-done", prompt)
    # A run done by the deadline alone must not pass for one the test let go.
    return InProcessResponse(content="released" if gate.exists() else "never released")


held = Agent("held", held_model)


if os.environ.get("RELAYQ_TEST_CELERYS_CONSUMER"):
    # The worker as the issue found it: Celery's own release of a lost connection.
    from celery.worker.consumer import Consumer as _Celerys

    from workers.app import Consumer as _Ours

    setattr(  # noqa: B010  (a method, put back for this worker process only)
        _Ours,
        "on_connection_error_after_connected",
        _Celerys.on_connection_error_after_connected,
    )
