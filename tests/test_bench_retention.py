"""The retention benchmark runs end to end at a tiny size, on SQLite and PostgreSQL.

No timing is asserted: a test machine's figures say nothing. What is checked is that
every seeded run was purged while interactive runs went on, and that the store kept
none of their rows.
"""

from __future__ import annotations

import pytest

from bench import retention

pytestmark = pytest.mark.timeout(300)


def test_the_benchmark_purges_every_seeded_run_beside_interactive_runs(
    capsys, machine_parts, tmp_path
):
    args = retention.parse(["--runs", "300", "--interactive", "3"])
    figures = [
        f for store in ("sqlite", "postgresql") if (f := retention.one(args, tmp_path, store))
    ]
    if len(figures) < 2:
        machine_parts.missing("postgres", "no PostgreSQL answered on 127.0.0.1:5432")

    for f in figures:
        assert f.purged == 300
        assert len(f.idle) == 3
        assert f.during, "interactive runs went on during the purge"
        assert f.rows_before >= 300 * 12
        assert f.seeded_left == 0, "every seeded row went"
        assert f.longest_removal_ms > 0, "the removals are told from other transactions"
        if f.store == "sqlite":  # the file's pages are given back, and timed apart
            assert f.longest_vacuum_ms > 0
    retention.print_table(figures)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| sqlite", "| postgresql"]
