"""How a client waits for results (`tasks.client.client`): an eager client, and one on a broker
without pub/sub, poll. Results pushed by real workers and brokers:
tests/durable/test_pushed_results.py."""

from __future__ import annotations

import gc
import sqlite3
import warnings
from pathlib import Path

import pytest

from store import UnknownRun
from tasks import DurableClient


def test_an_eager_client_and_one_on_a_broker_without_pub_sub_poll(tmp_path: Path):
    store = f"sqlite:///{tmp_path / 'relayq.db'}"
    for client in (
        DurableClient(eager=True, database_url=store),
        DurableClient(database_url=store, broker_url="memory://"),
    ):
        assert client.waiting == "polled"
        client.close()


def test_a_new_client_touches_no_store_until_it_opens(tmp_path: Path):
    # Given a store that does not exist yet, and one no server answers for
    path = tmp_path / "new.db"
    client = DurableClient(database_url=f"sqlite:///{path}", broker_url="memory://")
    nowhere = DurableClient(database_url="postgresql+psycopg://relayq@127.0.0.1:1/none")
    try:
        # Then building them did nothing
        assert not path.exists()
    finally:
        nowhere.close()
        # ... and `with` opens (migrates) the store, and leaves it closed
        with client as opened:
            assert opened is client
            assert path.exists()
            assert {"relayq_runs", "alembic_version"} <= tables(path)
    # ... a closed client closes again harmlessly, and does not open again
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.open()


async def test_the_first_verb_opens_the_store_and_async_with_closes_it(tmp_path: Path):
    path = tmp_path / "first.db"
    client = DurableClient(database_url=f"sqlite:///{path}", broker_url="memory://")
    with pytest.raises(UnknownRun):
        await client.result("run_nope")
    assert "relayq_runs" in tables(path)
    async with client:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        await client.result("run_nope")


def test_a_client_dropped_open_warns(tmp_path: Path):
    def open_and_drop() -> None:
        DurableClient(database_url=f"sqlite:///{tmp_path / 'd.db'}", broker_url="memory://").open()
        gc.collect()  # it is its own store seam's owner: a cycle

    with pytest.warns(ResourceWarning, match="dropped open"):
        open_and_drop()
    # ... and one closed, or never opened, does not
    closed = DurableClient(database_url=f"sqlite:///{tmp_path / 'd.db'}", broker_url="memory://")
    closed.open().close()
    never = DurableClient(database_url=f"sqlite:///{tmp_path / 'd.db'}", broker_url="memory://")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del closed, never
        gc.collect()


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
