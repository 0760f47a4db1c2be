"""API tokens (`RELAYQ_API_TOKENS`, `api._auth.Tokens`): entries with and without groups,
and a malformed entry refused by its number, never echoing its token."""

from __future__ import annotations

import pytest

from api._auth import Principal, Tokens
from tests.api.tokens import SECRET


def test_entries_with_and_without_groups_both_parse():
    tokens = Tokens.parse(
        " vic:viewer:t-v , alice:approver:t-a:finance|ops ,"
        "bob:approver:t-b:, sam:submitter:t-s: legal | eu-west "
    )

    assert len(tokens) == 4
    assert tokens.lookup("t-v") == Principal(name="vic", role="viewer", groups=())
    assert tokens.lookup("t-a") == Principal(
        name="alice", role="approver", groups=("finance", "ops")
    )
    assert tokens.lookup("t-b") == Principal(name="bob", role="approver")
    assert tokens.lookup("t-s") == Principal(
        name="sam", role="submitter", groups=("legal", "eu-west")
    )
    assert tokens.lookup("t-a:finance|ops") is None


MALFORMED_TOKENS = [
    pytest.param(f"alice:approver:{SECRET}:finance:extra", "not name:role:token", id="5 fields"),
    pytest.param(f"alice:approver:{SECRET}:x:y:z", "may not contain ':'", id="colon in token"),
    pytest.param(f"{SECRET}", "entry 1 is not", id="token alone"),
    pytest.param(f"alice:{SECRET}", "entry 1 is not", id="2 fields"),
    pytest.param("alice:approver:", "entry 1 is not", id="no token"),
    pytest.param(f":approver:{SECRET}", "entry 1 is not", id="no name"),
    pytest.param(
        f"alice:root:{SECRET}", "entry 1: its second field is not a role", id="unknown role"
    ),
    pytest.param(f"alice:{SECRET}:approver", "is not a role", id="token in the role's place"),
    pytest.param(f"{SECRET}:alice:approver", "is not a role", id="token in the name's place"),
    pytest.param(f"alice:approver:{SECRET}:finance||ops", "empty group", id="empty group"),
    pytest.param(f"alice:approver:{SECRET}:ops|ops", "named twice", id="group twice"),
    pytest.param(
        f"vic:viewer:t1,alice:approver:{SECRET},bob:approver:{SECRET}:ops",
        "entry 3 (bob) repeats another's token",
        id="token twice",
    ),
]


@pytest.mark.parametrize(("spec", "says"), MALFORMED_TOKENS)
def test_a_malformed_entry_is_refused_by_number_and_never_echoes_its_token(spec: str, says: str):
    with pytest.raises(ValueError, match="RELAYQ_API_TOKENS") as refused:
        Tokens.parse(spec)
    assert says in str(refused.value)
    assert SECRET not in str(refused.value)
    assert "s3cret" not in str(refused.value)
