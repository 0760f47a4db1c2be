"""Calling a builtin tool as a turn calls it: by name, in a context on a base folder.

`call` is the builtins tests' `_call` (`from .calls import call as _call`); the host tools'
tests keep their own, which hands the tool an answer and takes the request it may return.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relayq import ToolContext, ToolResult
from relayq.builtins import BuiltinsConfig, builtin_tools


async def call(
    base: Path, name: str, args: Any, config: BuiltinsConfig | None = None
) -> ToolResult:
    """The result of the builtin `name` (of `config`, else the builtins of it alone) on `args`."""
    tools = {t.name: t for t in builtin_tools(config or BuiltinsConfig.only(name))}
    ctx = ToolContext(run_id="run_t", call_id="c1", tool_name=name, base_dir=base)
    out = await tools[name].invoke(args, ctx)
    assert isinstance(out, ToolResult)
    return out
