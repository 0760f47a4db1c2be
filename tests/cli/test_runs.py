"""`relayq run`'s own checks (`cli.runs`): a bad budget is refused in one line, before any
store or broker is reached."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app as cli_app


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--max-tokens", "0"], "--max tokens must be more than 0, not 0"),
        (["--max-cost", "-2"], "--max cost must be more than 0, not -2.0"),
        (["--max-tokens", "10", "--over-budget", "maybe"], "--over-budget is ask or end"),
    ],
)
def test_the_cli_refuses_a_bad_budget_in_one_line(args: list[str], said: str):
    result = CliRunner().invoke(cli_app, ["run", "priced", "hello", *args])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"relayq: error: {said}")
