"""docs/configuration.md lists every setting with the default the settings themselves hold,
and every RELAYQ_ variable the code reads: one place declares each (`tasks.settings`), and
this keeps the page to it."""

from __future__ import annotations

import re
from pathlib import Path

from tasks.settings import options

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
CODE = ("api", "cli", "relayq", "store", "tasks", "workers")
ROW = re.compile(r"^\| `(RELAYQ_[A-Z_]+)` \|\s*([^|]*?)\s*\|", re.MULTILINE)


def _table() -> dict[str, str]:
    """Each variable of the page's table, with its default as the page writes it: the
    value in backticks (a remark in brackets after it aside), else the cell's words."""
    table = {}
    for name, cell in ROW.findall(PAGE.read_text()):
        value = re.fullmatch(r"`([^`]*)`(?:\s*\(.*\))?", cell.strip())
        table[name] = value.group(1) if value else cell.strip()
    return table


def test_every_setting_is_listed_with_the_default_it_has():
    table = _table()
    for option in options():
        assert option.variable in table, f"{option.variable} ({option.path}) is not in the table"
        assert table[option.variable] == option.default, (option.variable, option.path)


def test_every_variable_the_code_reads_is_listed():
    mentioned = {
        name
        for package in CODE
        for path in (ROOT / package).rglob("*.py")
        for name in re.findall(r"\bRELAYQ_[A-Z][A-Z_]*[A-Z]\b", path.read_text())
    }
    missing = sorted(mentioned - set(_table()))
    assert missing == [], f"read by the code, not in docs/configuration.md: {missing}"
