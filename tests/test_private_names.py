"""No module reaches into another's private names: each keeps its own to change freely."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("relayq", "store", "tasks", "workers", "api", "cli", "bench")


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
            continue
        top = node.module.split(".")[0]
        if top not in PACKAGES or node.module == path_module(path):
            continue
        for alias in node.names:
            # A leading-underscore module (relayq._transcript) is the package's own
            # shared internals; a leading-underscore *name* is one module's alone.
            if alias.name.startswith("_") and not _is_module(node.module, alias.name):
                found.append(f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}")
    return found


def path_module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _is_module(package: str, name: str) -> bool:
    base = ROOT.joinpath(*package.split("."), name)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def test_no_package_module_imports_a_private_name_of_another():
    offenders = [
        line
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in _private_imports(path)
    ]
    assert offenders == []
