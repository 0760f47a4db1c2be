"""The idle-hosts benchmark runs end to end at a small size: an API process, a process of
idle hosts holding long polls, and a viewer.

No timing is asserted. What is checked is what holds at any size: each phase measured,
every host's long polls answered (as many as the phase allowed), and nothing left behind.
"""

from __future__ import annotations

import pytest

from bench import idle_hosts

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("leaves_no_folder")]


def test_idle_hosts_are_measured_beside_none_and_each_long_poll_answered(capsys):
    idle_hosts.main(["--hosts", "20", "--wait", "1", "--seconds", "2", "--stores", "sqlite"])

    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| sqlite")]  # fmt: skip
    assert [(r[1], r[2]) for r in rows] == [("this", "0"), ("this", "20")]
    assert rows[0][7] == "0", "no host, no wait"
    # 20 hosts, waits of a second, two phases of 2 s: each host's polls answered in turn
    assert int(rows[1][7].replace(",", "")) >= 20 * 3
