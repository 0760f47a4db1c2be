"""The relay-hosts benchmark runs end to end at a small size: a worker, the API and
`relayq host` processes, each phase's runs done.

No timing is asserted: a test machine's figures say nothing. What is checked is what
the hosts must do at any size: every run done, and each call leased once (no lease
lapsed, none taken twice).
"""

from __future__ import annotations

import pytest

from bench import hosts

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("leaves_no_folder")]
START_EARLY = True  # tests/conftest.py: its test takes long, so a lane takes it first


def test_hosts_serve_every_phase_each_call_leased_once(capsys):
    hosts.main(["--runs", "12", "--trickle", "3", "--hosts", "2", "--concurrency", "4",
                "--stores", "sqlite"])  # fmt: skip

    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| sqlite")]  # fmt: skip
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("backlog", "12", "0"),
        ("burst", "12", "0"),
        ("trickle", "3", "0"),
    ]
    assert {r[11] for r in rows} == {"1.00"}, "each call leased once"
    assert all(float(r[4]) > 0 for r in rows), "calls answered"
