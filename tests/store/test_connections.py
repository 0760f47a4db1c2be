"""A process holds at most RELAYQ_STORE_CONNECTIONS connections to PostgreSQL: an operator
running many workers on one server (its `max_connections`, 100 by default) sizes them so."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from store import Database
from store.db import CONNECTIONS_ENV


def _server_connections(url: str, db: Database) -> int:
    probe = Database(url)
    try:
        with probe.engine.connect() as conn:
            query = text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name")
            found = conn.execute(query, {"name": db.engine.url.database}).scalar_one()
            return int(found) - 1  # not the probe's own
    finally:
        probe.dispose()


def test_a_process_holds_no_more_connections_than_the_setting(
    pg: Database, monkeypatch: pytest.MonkeyPatch
):
    # Given a store opened with RELAYQ_STORE_CONNECTIONS=3
    monkeypatch.setenv(CONNECTIONS_ENV, "3")
    url = pg.engine.url.render_as_string(hide_password=False)
    before = _server_connections(url, pg)  # the fixture's own
    db = Database(url)
    held = [db.engine.connect() for _ in range(3)]
    try:
        for conn in held:
            conn.execute(text("SELECT 1"))
        assert _server_connections(url, db) == before + 3

        # When a fourth is asked for, it waits for one of the three
        got = threading.Event()

        def fourth() -> None:
            with db.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
                got.set()

        asking = threading.Thread(target=fourth)
        asking.start()
        assert not got.wait(0.5), "a fourth connection was opened"
        assert _server_connections(url, db) == before + 3

        # And it gets one once one is handed back
        held.pop().close()
        assert got.wait(10)
        asking.join()
    finally:
        for conn in held:
            conn.close()
        db.dispose()


@pytest.mark.parametrize("raw", ["0", "1", "ten", "-4", "4.5", "٣"])
def test_a_bound_that_is_not_a_whole_number_of_2_or_more_is_refused(
    raw: str, monkeypatch: pytest.MonkeyPatch, tmp_path
):
    monkeypatch.setenv(CONNECTIONS_ENV, raw)
    with pytest.raises(ValueError, match=rf"{CONNECTIONS_ENV} must be a whole number, 2 or more"):
        Database("postgresql+psycopg://postgres@127.0.0.1:1/never")
