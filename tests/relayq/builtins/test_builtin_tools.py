"""builtin_tools: which tools, in which order, with which schemas."""

from __future__ import annotations

from pathlib import Path

import pytest

import relayq.builtins
from relayq import Tool
from relayq.builtins import BUILTIN_NAMES, BuiltinsConfig, builtin_tools

from .calls import call as _call


def test_the_exported_names_are_pinned() -> None:
    assert sorted(relayq.builtins.__all__) == [
        "BASH_ENV_NAMES",
        "BUILTIN_NAMES",
        "BuiltinsConfig",
        "builtin_tools",
    ]


def test_all_builtins_come_in_builtin_names_order() -> None:
    tools = builtin_tools(BuiltinsConfig())

    assert [t.name for t in tools] == list(BUILTIN_NAMES)
    assert all(isinstance(t, Tool) and not t.is_relay for t in tools)


def test_only_the_enabled_builtins_are_built_in_canonical_order() -> None:
    tools = builtin_tools(BuiltinsConfig.only("todowrite", "read", "bash"))

    assert [t.name for t in tools] == ["bash", "read", "todowrite"]


def test_no_builtins_when_they_are_off() -> None:
    assert builtin_tools(BuiltinsConfig.off()) == []


@pytest.mark.parametrize("tool", builtin_tools(BuiltinsConfig()), ids=lambda t: t.name)
def test_every_schema_is_a_strict_object_with_described_properties(tool: Tool) -> None:
    schema = tool.schema

    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) <= set(schema["properties"])
    for name, prop in schema["properties"].items():
        assert prop.get("description"), f"{tool.name}.{name} has no description"
    assert len(tool.description) > 40


@pytest.mark.parametrize("name", BUILTIN_NAMES)
async def test_an_unknown_argument_is_an_error_result(tmp_path: Path, name: str) -> None:
    out = await _call(tmp_path, name, {"bogus": 1})

    assert out.is_error
    assert "unknown argument(s) bogus" in out.output


@pytest.mark.parametrize("name", [n for n in BUILTIN_NAMES if n != "todowrite"])
async def test_a_missing_required_argument_is_an_error_result(tmp_path: Path, name: str) -> None:
    out = await _call(tmp_path, name, {})

    assert out.is_error
    assert "missing required argument" in out.output


@pytest.mark.parametrize("name", ["read", "write", "edit", "grep", "glob", "apply_patch"])
async def test_a_wrongly_typed_argument_is_an_error_result(tmp_path: Path, name: str) -> None:
    args = {
        "path": 5,
        "content": "",
        "old_string": "a",
        "new_string": "b",
        "pattern": 5,
        "patch": 5,
    }
    schema_props = builtin_tools(BuiltinsConfig.only(name))[0].schema["properties"]

    out = await _call(tmp_path, name, {k: v for k, v in args.items() if k in schema_props})

    assert out.is_error
    assert "must be a string" in out.output


async def test_a_missing_base_directory_is_an_error_result(tmp_path: Path) -> None:
    out = await _call(tmp_path / "gone", "read", {"path": "a.txt"})

    assert out.is_error
    assert "does not exist" in out.output
