"""Flower's own checks (`workers.flower`): no serving beyond loopback without a password, and
a malformed password list refused without echoing it."""

from __future__ import annotations

import pytest

from tests.ports import free_port
from workers.flower import credentials, run


def test_flower_will_not_serve_beyond_loopback_without_a_password(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.delenv("RELAYQ_FLOWER_AUTH", raising=False)
    with pytest.raises(SystemExit) as refused:
        run(port=free_port(), address="0.0.0.0")
    message = str(refused.value.code)
    assert "RELAYQ_FLOWER_AUTH" in message
    assert "\n" not in message


def test_a_malformed_password_list_is_refused_without_echoing_it():
    assert credentials(" ops:pw1, alice:pw2 ") == ["ops:pw1", "alice:pw2"]
    with pytest.raises(SystemExit) as refused:
        credentials("ops:hunter2,hunter3")
    assert (
        str(refused.value.code)
        == "relayq flower: entry 2 of RELAYQ_FLOWER_AUTH is not user:password"
    )
