"""The inbox's pages as its templates render them: what agents, models and people wrote
stays text, never markup or an attribute of its own."""

from __future__ import annotations

from typing import Any

from api._auth import Principal
from api._inbox import templates
from api._inbox_lists import Filters
from api._inbox_views import item_of
from relayq import Request
from store import StoredRequest
from store.models import utcnow


def render_list(**context: Any) -> str:
    """The open requests' page as the inbox renders it, with `context` over the defaults."""
    defaults: dict[str, Any] = {
        "history": False,
        "total": len(context.get("requests", [])),
        "first": 1,
        "last": len(context.get("requests", [])),
        "next_url": None,
        "first_url": None,
        "agents": [],
        "ages": [],
        "statuses": [],
        "sizes": [50],
        "cap": 1000,
        "can_answer": True,
        "here": "/",
    }
    return templates.get_template("inbox.html").render({**defaults, **context})


def test_the_inbox_escapes_what_agents_and_models_wrote():
    # Given a request whose every field carries markup
    evil = "<script>alert(1)</script>"
    stored = StoredRequest(
        request=Request(
            kind="tool_call",
            prompt=evil,
            data={"calls": [{"id": "c1", "name": evil, "input": {"q": evil}}]},
        ),
        run_id=evil,
        agent=evil,
        status="open",
        created_at=utcnow(),
    )

    # When the inbox renders it, for a user whose name and groups carry markup too
    html = render_list(
        who=Principal(name=evil, role="approver", groups=(evil, "ops")),
        requests=[item_of(stored)],
        error=evil,
        flash=evil,
        csrf='"><script>alert(2)</script>',
        filters=Filters(agent=evil, q=evil),
    )

    # Then no markup of theirs survives, and the arguments are shown in brief
    assert "<script>alert" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8
    assert 'value="&#34;&gt;&lt;script&gt;alert(2)' in html
    assert "q: &lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_inbox_keeps_attribute_breaking_text_inside_its_attributes():
    # Given a request whose id, agent and call carry a quote that would end an attribute
    breaker = '" onmouseover="alert(1)" x="'
    stored = StoredRequest(
        request=Request(
            id=f"req_{breaker}",
            kind="tool_call",
            prompt=breaker,
            data={"calls": [{"id": breaker, "name": breaker, "input": {breaker: breaker}}]},
        ),
        run_id=breaker,
        agent=breaker,
        status="open",
        created_at=utcnow(),
    )

    # When the inbox renders it
    html = render_list(
        who=Principal(name="alice", role="approver"),
        requests=[item_of(stored)],
        error=None,
        flash=breaker,
        csrf="token",
        filters=Filters(tool=breaker, q=breaker),
    )

    # Then every quote is an entity: no attribute of theirs appears on any element
    assert '" onmouseover' not in html
    assert 'onmouseover="' not in html
    assert 'data-request-id="req_&#34; onmouseover=&#34;alert(1)&#34; x=&#34;"' in html
