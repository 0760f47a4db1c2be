"""The MCP sessions benchmark runs end to end at a small size: one `relayq mcp` process,
sessions of 2025-11-25 clients opened beside one that lists the tools.

No timing is asserted. What is checked is what holds at any size: both sides measured,
every session opened, and nothing left behind.
"""

from __future__ import annotations

import pytest

from bench import mcp_sessions

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("leaves_no_folder")]


def test_sessions_held_open_are_measured_beside_one(capsys):
    mcp_sessions.main(["--sessions", "6", "--listings", "5", "--idle", "0.5"])

    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["1", "7"]
    one, many = rows
    assert (one[3], one[4], one[7]) == ("-", "-", "1.00x"), "one session opened, not measured"
    assert float(many[3]) > 0
    assert float(many[1]) > 0
    assert one[2].endswith("%")
