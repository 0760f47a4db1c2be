"""No module reaches into another's private names: each keeps its own to change freely."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
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
            # A leading-underscore module (relayq.transcript) is the package's own
            # shared internals; a leading-underscore *name* is one module's alone.
            if alias.name.startswith("_") and not _is_module(node.module, alias.name):
                found.append(f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}")
    return found


def path_module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _is_module(package: str, name: str) -> bool:
    base = ROOT.joinpath(*package.split("."), name)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _offenders(check: Callable[[Path], list[str]]) -> list[str]:
    return [
        line
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in check(path)
    ]


def test_no_package_module_imports_a_private_name_of_another():
    assert _offenders(_private_imports) == []


def _private_modules_of_others(path: Path) -> list[str]:
    """`from relayq._transcript import ...` or `from relayq import _transcript` in a module
    outside relayq: another package's underscore module, its to change freely."""
    own = path.relative_to(ROOT).parts[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
            continue
        parts = node.module.split(".")
        if parts[0] not in PACKAGES or parts[0] == own:
            continue
        modules = [*parts[1:], *(a.name for a in node.names if _is_module(node.module, a.name))]
        private = [m for m in modules if m.startswith("_") and not m.startswith("__")]
        if private:
            found.append(f"{path.relative_to(ROOT)}: from {node.module} ({private[0]})")
    return found


def test_no_package_imports_another_packages_private_module():
    assert _offenders(_private_modules_of_others) == []


MODULE_PATH = re.compile(r"[a-z_]\w*(?:\.[a-z_]\w*)+(?::\w+)?")
"""A string that names a module (`api._auth`), or a name in one (`workers.app:Consumer`):
what `importlib.import_module`, a `module:attr` setting or Celery's imports load."""


def _private_modules_named_in_strings(path: Path) -> list[str]:
    """`importlib.import_module("api._auth")`, or any string naming another package's
    underscore module: an import the import statements above do not show."""
    own = path.relative_to(ROOT).parts[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        if not MODULE_PATH.fullmatch(node.value):
            continue
        parts = node.value.partition(":")[0].split(".")
        if parts[0] not in PACKAGES or parts[0] == own:
            continue
        private = [
            name
            for depth, name in enumerate(parts[1:], start=1)
            if name.startswith("_") and _is_module(".".join(parts[:depth]), name)
        ]
        if private:
            found.append(f"{path.relative_to(ROOT)}: {node.value!r} ({private[0]})")
    return found


def test_no_package_loads_another_packages_private_module_by_name():
    assert _offenders(_private_modules_named_in_strings) == []
