"""RELAYQ_RETENTION on a real worker: its sweeps remove the runs finished longer ago than
the retention (`store.retention`), and leave the rest."""

from __future__ import annotations

from datetime import timedelta

from sqlmodel import select

from store.models import DecisionRow, DeliveryRow, EventRow, RunRow, utcnow
from tasks import DurableClient

from .conftest import Eventually, SpareWorkers


async def test_a_worker_sweeping_removes_runs_finished_longer_ago_than_the_retention(
    spare_workers: SpareWorkers, private_database: str, eventually: Eventually, prompt: str
):
    # Given a worker keeping finished runs 30 days, sweeping twice a second, and two
    # runs it finished
    spare = spare_workers.start(
        RELAYQ_DATABASE_URL=private_database, RELAYQ_RETENTION="30d", RELAYQ_SWEEP_EVERY="0.5"
    )
    client = DurableClient(settings=spare.settings)
    try:
        old, recent = await client.start_many("recall", [f"{prompt} old", f"{prompt} recent"])
        for run_id in (old, recent):
            assert (await client.result(run_id, wait=True, timeout=60)).status == "done"

        # When one of them was last changed 40 days ago, the other a day ago
        with client.db.write() as s:
            for run_id, age in ((old, 40), (recent, 1)):
                run = s.get(RunRow, run_id)
                assert run is not None
                run.updated_at = utcnow() - timedelta(days=age)

        # Then a sweep removes the old one, and the recent one stays
        def gone() -> bool:
            with client.db.read() as s:
                return s.get(RunRow, old) is None

        await eventually(gone, timeout=30, what="the old run removed by a sweep")
        with client.db.read() as s:
            assert s.get(RunRow, recent) is not None
    finally:
        client.close()


async def test_a_worker_sweeping_removes_settled_webhook_events_and_old_audit_rows(
    spare_workers: SpareWorkers, private_database: str, eventually: Eventually
):
    # Given a worker keeping webhook events 7 days and the audit trail 90 days, with a
    # settled event and a decision older than that, and a pending event as old
    spare = spare_workers.start(
        RELAYQ_DATABASE_URL=private_database,
        RELAYQ_WEBHOOK_RETENTION="7d",
        RELAYQ_AUDIT_RETENTION="90d",
        RELAYQ_SWEEP_EVERY="0.5",
    )
    client = DurableClient(settings=spare.settings)
    try:
        old = utcnow() - timedelta(days=100)
        with client.db.write() as s:
            for event_id, state in (("ev_settled", "delivered"), ("ev_pending", "pending")):
                s.add(EventRow(id=event_id, type="run.finished", created_at=old))
                s.add(DeliveryRow(event_id=event_id, endpoint="ops", state=state,
                                  next_at=old + timedelta(days=365), created_at=old))  # fmt: skip
            s.add(DecisionRow(request_id="req_old", run_id="run_old", agent="refunds",
                              actor="alice", via="inbox", outcome="approved", at=old))  # fmt: skip

        # Then a sweep removes the settled event and the old decision; the pending stays
        def swept() -> bool:
            with client.db.read() as s:
                return (
                    s.get(EventRow, "ev_settled") is None
                    and not s.exec(
                        select(DecisionRow).where(DecisionRow.request_id == "req_old")
                    ).all()
                )

        await eventually(swept, timeout=30, what="the old event and decision removed")
        with client.db.read() as s:
            assert s.get(EventRow, "ev_pending") is not None
    finally:
        client.close()
