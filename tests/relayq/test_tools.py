"""Tools and toolkits: schemas, the @tool decorator, names, and the provider shapes."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Literal

import pytest

from relayq import (
    BUILTIN_NAMES,
    BuiltinsConfig,
    ToolContext,
    ToolkitError,
    ToolResult,
    create_toolkit,
    define_tool,
    tool,
)
from relayq.relay import relay_tool


def ctx(tmp_path, name: str = "t") -> ToolContext:
    return ToolContext(run_id="run_1", call_id="c1", tool_name=name, base_dir=tmp_path)


async def test_the_tool_decorator_infers_the_schema_from_type_hints():
    @tool
    def forecast(city: str, days: int = 3, units: Literal["c", "f"] = "c") -> str:
        """Weather for a city."""
        return f"{city}:{days}:{units}"

    assert forecast.description == "Weather for a city."
    assert forecast.schema["type"] == "object"
    assert forecast.schema["required"] == ["city"]
    assert forecast.schema["properties"]["days"]["type"] == "integer"
    assert forecast.schema["properties"]["units"]["enum"] == ["c", "f"]
    assert forecast.schema["additionalProperties"] is False


async def test_a_decorated_tool_validates_its_arguments_before_running(tmp_path):
    ran = []

    @tool(name="add_up", description="Adds.")
    async def add(a: int, b: int) -> str:
        ran.append((a, b))
        return str(a + b)

    good = await add.invoke({"a": 2, "b": "3"}, ctx(tmp_path))
    bad = await add.invoke({"a": "two"}, ctx(tmp_path))

    assert (add.name, add.description) == ("add_up", "Adds.")
    assert good == ToolResult(output="5")
    assert isinstance(bad, ToolResult)
    assert bad.is_error
    assert "invalid arguments for add_up" in bad.output
    assert "a:" in bad.output
    assert "b:" in bad.output
    assert ran == [(2, 3)]


async def test_a_decorated_tool_receives_its_context_outside_the_schema(tmp_path):
    @tool
    def who(ctx: ToolContext, greeting: str = "hi") -> str:
        return f"{greeting} {ctx.idempotency_key}"

    assert "ctx" not in who.schema["properties"]
    assert await who.invoke({}, ctx(tmp_path)) == ToolResult(output="hi run_1:1:c1")


async def test_a_tool_returning_neither_text_nor_a_result_gives_an_error_result(tmp_path):
    odd = define_tool("odd", "returns a number", None, lambda a, c: 42)  # type: ignore[arg-type,return-value]
    out = await odd.invoke({}, ctx(tmp_path))
    assert isinstance(out, ToolResult)
    assert out.is_error
    assert "returned int" in out.output


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "dots.not.ok"])
def test_a_tool_name_providers_would_refuse_is_a_toolkit_error(name):
    with pytest.raises(ToolkitError, match="tool name"):
        relay_tool(name, "bad")


def test_a_schema_that_is_not_an_object_schema_is_a_toolkit_error():
    with pytest.raises(ToolkitError, match="type 'object'"):
        relay_tool("x", "bad", {"type": "string"})


async def test_two_extra_tools_with_one_name_are_a_toolkit_error():
    with pytest.raises(ToolkitError, match="share the name dup"):
        await create_toolkit(
            builtins=BuiltinsConfig.off(),
            extra_tools=[relay_tool("dup", "a"), relay_tool("dup", "b")],
        )


async def test_builtins_are_all_on_by_default_and_can_be_narrowed(tmp_path):
    everything = await create_toolkit(base_dir=tmp_path)
    some = await create_toolkit(builtins=BuiltinsConfig.only("read", "grep"), base_dir=tmp_path)
    none = await create_toolkit(builtins=BuiltinsConfig.off(), base_dir=tmp_path)

    assert [t.name for t in everything.tools] == list(BUILTIN_NAMES)
    assert len(BUILTIN_NAMES) == 10
    assert [t.name for t in some.tools] == ["read", "grep"]
    assert none.tools == []


def test_naming_an_unknown_builtin_is_a_toolkit_error():
    with pytest.raises(ToolkitError, match="unknown builtin"):
        BuiltinsConfig.only("read", "teleport")


async def test_a_base_dir_that_is_not_a_folder_is_a_toolkit_error(tmp_path):
    with pytest.raises(ToolkitError, match="not a folder"):
        await create_toolkit(base_dir=tmp_path / "missing")


async def test_the_toolkit_speaks_both_provider_shapes():
    schema: dict[str, Any] = {"type": "object", "properties": {"q": {"type": "string"}}}
    tk = await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[relay_tool("lookup", "find", schema)]
    )

    assert tk.to_openai() == [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "find", "parameters": schema},
        }
    ]
    assert tk.to_anthropic() == [{"name": "lookup", "description": "find", "input_schema": schema}]
    assert tk.get("lookup") is tk.tools[0]
    assert tk.get("missing") is None


async def test_the_toolkit_digest_changes_with_any_schema_or_relay_flag():
    base = await create_toolkit(builtins=BuiltinsConfig.off(), extra_tools=[relay_tool("a", "x")])
    same = await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[relay_tool("a", "other words")]
    )
    schema = await create_toolkit(
        builtins=BuiltinsConfig.off(),
        extra_tools=[
            relay_tool("a", "x", {"type": "object", "properties": {"n": {"type": "integer"}}})
        ],
    )
    local = await create_toolkit(
        builtins=BuiltinsConfig.off(), extra_tools=[define_tool("a", "x", None, lambda a, c: "")]
    )

    assert base.digest() == same.digest()
    assert len({base.digest(), schema.digest(), local.digest()}) == 3


# -- issue 51: per-tool timeouts ----------------------------------------------------------------


async def test_an_async_call_past_its_tools_timeout_is_cancelled_and_its_result_says_so(tmp_path):
    # Given an async tool with a timeout of 0.2 s that never returns
    cancelled: list[bool] = []

    async def slow(args: dict[str, Any], c: ToolContext) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "late"

    # When it is called
    began = time.monotonic()
    out = await define_tool("slow", "s", None, slow, timeout=0.2).invoke({}, ctx(tmp_path))

    # Then the call ends within its bound, cancelled, and its result is an error naming it
    assert time.monotonic() - began < 10
    assert cancelled == [True]
    assert isinstance(out, ToolResult)
    assert out.is_error
    assert "the tool 'slow' did not return within 0.2 s" in out.output


async def test_a_sync_call_past_the_agents_timeout_returns_while_its_thread_runs_on(tmp_path):
    # Given a sync tool with no timeout of its own, its caller's default 0.2 s
    release = threading.Event()

    @tool
    def hang() -> str:
        release.wait(30)
        return "late"

    try:
        # When it is called and never returns
        out = await hang.invoke({}, ctx(tmp_path), timeout=0.2)

        # Then its result is an error naming it, at the default's bound
        assert isinstance(out, ToolResult)
        assert out.is_error
        assert "the tool 'hang' did not return within 0.2 s" in out.output
        # ... and a tool's own timeout wins over the default
        fast = define_tool("fast", "f", None, lambda a, c: "ok", timeout=5)
        fine = await fast.invoke({}, ctx(tmp_path), timeout=0.01)
        assert isinstance(fine, ToolResult)
        assert fine.output == "ok"
    finally:
        release.set()


async def test_a_tool_raising_its_own_timeout_error_is_an_ordinary_error(tmp_path):
    def raises(args: dict[str, Any], c: ToolContext) -> str:
        raise TimeoutError("upstream took too long")

    out = await define_tool("up", "u", None, raises, timeout=5).invoke({}, ctx(tmp_path))
    assert isinstance(out, ToolResult)
    assert out.is_error
    assert out.output == "TimeoutError: upstream took too long"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_timeout_that_is_not_a_positive_number_is_a_toolkit_error(bad):
    with pytest.raises(ToolkitError, match="timeout must be a positive number of seconds"):
        define_tool("t", "t", None, lambda a, c: "x", timeout=bad)
    with pytest.raises(ToolkitError, match="timeout must be a positive number of seconds"):
        tool(name="t", timeout=bad)(lambda: "x")
