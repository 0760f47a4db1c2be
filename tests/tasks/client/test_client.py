"""How a client waits for results (`tasks.client.client`): an eager client, and one on a broker
without pub/sub, poll. Results pushed by real workers and brokers:
tests/durable/test_pushed_results.py."""

from __future__ import annotations

from pathlib import Path

from tasks import DurableClient


def test_an_eager_client_and_one_on_a_broker_without_pub_sub_poll(tmp_path: Path):
    store = f"sqlite:///{tmp_path / 'relayq.db'}"
    for client in (
        DurableClient(eager=True, database_url=store),
        DurableClient(database_url=store, broker_url="memory://"),
    ):
        assert client.waiting == "polled"
        client.close()
