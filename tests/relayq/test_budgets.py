"""A budget (`relayq.Budget`) names a limit of tokens, of cost or both, each above 0, and what
to do past it: ask, or end."""

from __future__ import annotations

import pytest

from relayq import Budget


def test_a_budget_without_a_limit_or_with_a_bad_one_is_refused():
    with pytest.raises(ValueError, match="tokens, cost or both"):
        Budget()
    with pytest.raises(ValueError, match="greater than 0"):
        Budget(tokens=0)
    with pytest.raises(ValueError, match="greater than 0"):
        Budget(cost=-1.0)
    with pytest.raises(ValueError, match="'ask' or 'end'"):
        Budget(tokens=10, on_exceed="shrug")
