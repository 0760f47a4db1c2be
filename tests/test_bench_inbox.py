"""The inbox benchmark runs end to end at tiny sizes: seeding, the real server, the table.

No timing is asserted: a test machine's figures say nothing. What is checked is
that every page was fetched, answered 200, and was measured at every size.
"""

from __future__ import annotations

from bench import inbox
from store import Database, RequestQuery, query_requests


def test_the_seeded_requests_read_back_as_the_store_writes_them(tmp_path):
    # Given a store seeded with 20 open requests
    db = Database(f"sqlite:///{tmp_path / 'relayq.db'}")
    try:
        inbox.seed(db, 20)

        # When they are listed, all of them and those a group may decide
        every = query_requests(db, RequestQuery(limit=100))
        finance = query_requests(db, RequestQuery(group="finance", limit=100))
    finally:
        db.dispose()

    # Then all 20 are open, approvals (with groups) and relay calls (with arguments) alike
    assert every.total == 20
    kinds = {s.request.kind for s in every}
    assert kinds == {"tool_approval", "tool_call"}
    assert 0 < finance.total < 20
    assert all("finance" in s.approvers for s in finance)
    for stored in every:
        data = stored.request.data
        assert stored.tool
        if stored.request.kind == "tool_call":
            assert data["calls"][0]["input"]
        else:
            assert data["arguments"]
            assert stored.approvers


def test_the_benchmark_measures_every_page_at_every_size(tmp_path, capsys):
    # When the benchmark runs at 5 and 20 open requests, 3 samples a page
    results = inbox.run([5, 20], samples=3, warmup=1, postgres=False, home=tmp_path)

    # Then each page was timed 3 times at each size
    labels = [p.label for p in inbox.pages("a cursor")]
    assert sorted((r.page.label, r.size) for r in results) == sorted(
        (label, size) for label in labels for size in (5, 20)
    )
    assert all(len(r.ttfbs) == 3 and r.size_bytes > 0 for r in results)
    # and the API's pages hold what the store does: the first page, and the half after the cursor
    api = {(r.page.label, r.size): r.ids for r in results if r.page.bearer}
    assert len(api["api: limit=50", 20] or []) == 20
    assert len(api["api: cursor halfway", 20] or []) == 10
    assert len(api["api: cursor halfway", 5] or []) == 3

    # And the table shows every page, with the ratio of the medians
    inbox.print_table(results, [5, 20], markdown=True)
    table = capsys.readouterr().out
    assert "median 20 / 5" in table
    assert all(label in table for label in labels)
