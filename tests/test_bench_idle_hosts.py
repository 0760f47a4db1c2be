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
    idle_hosts.main(
        ["--hosts", "20", "--wait", "1", "--seconds", "2", "--stores", "sqlite", "--pure"]
    )

    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| sqlite")]  # fmt: skip
    # --pure: the same code first, with uvicorn's h11 and asyncio
    assert [(r[1], r[2]) for r in rows] == [
        ("this, pure", "0"), ("this, pure", "20"), ("this", "0"), ("this", "20")
    ]  # fmt: skip
    for idle, hosts in (rows[0:2], rows[2:4]):
        assert idle[8] == "0", "no host, no wait"
        assert idle[4] == "-", "no request answered, no cost a request"
        # 20 hosts, waits of a second, two phases of 2 s: each host's polls answered in turn
        assert int(hosts[8].replace(",", "")) >= 20 * 3
        assert float(hosts[4]) > 0, "the CPU for each request answered while it was measured"
