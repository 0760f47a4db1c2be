"""The transport benchmark runs end to end at a tiny size: both transports, both cases."""

from __future__ import annotations

from bench import transport


def test_the_benchmark_measures_both_transports_in_both_cases(capsys):
    sizes = {"--in-flight": "4", "--rounds": "2", "--latency": "0.05", "--sequential": "4"}
    transport.main([*(part for pair in sizes.items() for part in pair), "--repeat", "2"])

    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| case | calls | httpx (old) CPU ms/call | aiohttp (new) CPU")
    assert [row.split(" | ")[:2] for row in table[1:]] == [
        ["| 4 in flight, 0.05 s latency", "8"],
        ["| one at a time, instant", "4"],
    ]
    assert all(row.split(" | ")[4].endswith("x") for row in table[1:]), "old / new is shown"
