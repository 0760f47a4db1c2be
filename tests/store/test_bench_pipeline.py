"""bench.pipeline's four ways of ending a turn each commit what they write.

No timing is asserted: each way ran, and every end it timed left its row in the
outbox and its message, and moved the run's version on by one.
"""

from __future__ import annotations

from sqlalchemy import text

from bench import pipeline
from store import Database


def test_each_way_of_ending_a_turn_commits_every_end_it_times(pg: Database):
    figures = pipeline.measure(pg, ends=6, rounds=2)

    assert set(figures) == {"sqlalchemy", "pinged", "psycopg", "pipelined"}
    assert all(len(rounds) == 2 for rounds in figures.values())
    # Each way: 10 ends to warm, then 3 a round
    ends = 4 * (10 + 2 * 3)
    with pg.connect() as conn:
        outbox = conn.execute(
            text("SELECT count(*) FROM relayq_outbox WHERE label LIKE :l"),
            {"l": f"{pipeline.RUN} bench turn %"},
        ).scalar_one()
        messages = conn.execute(
            text("SELECT count(*) FROM relayq_messages WHERE role = 'assistant'")
        ).scalar_one()
    assert outbox == ends
    assert messages == ends
