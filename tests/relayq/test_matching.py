"""Constraints on a call's arguments: parsed, checked, matched."""

from __future__ import annotations

import pytest

from relayq import ToolkitError
from relayq.matching import Matcher, parse_constraint, parse_constraints

ARGS = {"amount": 40, "currency": "EUR", "order": {"id": "17", "lines": 2}, "rush": True}


@pytest.mark.parametrize(
    ("text", "holds"),
    [
        ("amount <= 50", True),
        ("amount < 40", False),
        ("amount >= 40.0", True),
        ("amount > 39.5", True),
        ('currency == "EUR"', True),
        ('currency != "EUR"', False),
        ('currency in ["EUR", "USD"]', True),
        ('currency not in ["EUR", "USD"]', False),
        ('order.id == "17"', True),
        ("order.lines == 2", True),
        ("rush == true", True),
        ("rush == 1", False),  # true is not 1
        ("missing == 1", False),
        ("missing != 1", True),
        ('missing not in ["a"]', True),
        ("missing < 3", None),
        ("currency < 5", None),
        ('amount < "50"', None),
    ],
)
def test_a_constraint_holds_or_not_or_cant_be_told(text: str, holds: bool | None):
    assert parse_constraint(text).holds(ARGS) is holds


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("amount is 5", "is not a constraint"),
        ("amount <= fifty", "is not a JSON value"),
        ("currency == 'EUR'", "is not a JSON value"),
        ('currency in "EUR"', "takes a JSON list"),
        ("amount < true", "compares with a number or a string"),
        ("", "is not a constraint"),
        ("1amount == 2", "is not a constraint"),
    ],
)
def test_a_bad_constraint_is_refused_saying_why(text: str, says: str):
    with pytest.raises(ToolkitError, match=says):
        parse_constraint(text)


def test_a_constraint_reads_back_as_written():
    assert str(parse_constraint('currency   not   in ["EUR"]')) == 'currency not in ["EUR"]'
    assert parse_constraints(["amount <= 50"]) == (parse_constraint("amount <= 50"),)


def test_a_matcher_of_constraints_needs_them_all():
    both = Matcher(where=parse_constraints(["amount <= 50", 'currency == "EUR"']))
    assert both.matches(ARGS)
    assert not both.matches({**ARGS, "currency": "USD"})
    assert not both.matches({"currency": "EUR"}), "an absent amount can't be told: no match"
    assert Matcher().matches(ARGS), "no constraints: every call"


def test_a_matcher_of_exact_arguments():
    exact = Matcher(arguments={"amount": 40, "currency": "EUR"})
    assert exact.matches({"currency": "EUR", "amount": 40.0})
    assert not exact.matches({"currency": "EUR", "amount": 40, "note": "x"})


def test_a_matcher_on_the_wire_and_back():
    for m in (Matcher(arguments={"a": 1}), Matcher(where=parse_constraints(["a < 2"])), Matcher()):
        assert Matcher.from_wire(m.to_wire()) == m
    with pytest.raises(ToolkitError):
        Matcher.from_wire({"where": ["a <"]})
