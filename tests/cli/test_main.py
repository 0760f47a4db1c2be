"""The `relayq` command itself (`cli.main`): its version."""

from __future__ import annotations

import importlib.metadata

from typer.testing import CliRunner

from cli.main import app


def test_version_prints_the_installed_packages_version():
    result = CliRunner().invoke(app, ["--version"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"relayq {importlib.metadata.version('relayq')}\n"
