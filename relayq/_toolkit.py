"""A toolkit: the tools one run offers its model, by name."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from relayq._errors import ToolkitError
from relayq._tools import Tool
from relayq.builtins import BUILTIN_NAMES, BuiltinsConfig, builtin_tools

__all__ = ["Toolkit", "create_toolkit"]


class Toolkit:
    """An immutable set of tools with unique names, and the folder file tools work in."""

    def __init__(self, tools: Sequence[Tool], *, base_dir: Path) -> None:
        self._tools = {t.name: t for t in tools}
        if len(self._tools) != len(tools):
            names = [t.name for t in tools]
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ToolkitError(f"two tools share the name {', '.join(dup)}", dup[0])
        self.base_dir = base_dir
        self._digest: str | None = None

    @property
    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def relay_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self._tools.values() if t.is_relay)

    def to_openai(self) -> list[dict[str, Any]]:
        """Tools in OpenAI's chat-completions `tools` shape."""
        return [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.schema},
            }
            for t in self._tools.values()
        ]

    def to_anthropic(self) -> list[dict[str, Any]]:
        """Tools in Anthropic's messages `tools` shape."""
        return [
            {"name": t.name, "description": t.description, "input_schema": t.schema}
            for t in self._tools.values()
        ]

    def digest(self) -> str:
        """A short hash of every tool's name, schema and relay flag.

        A stored run keeps it, so a worker can tell that the tools it would
        resume with are not the ones the run was started with.
        """
        if self._digest is None:  # once: every turn asks
            tools = sorted(self.tools, key=lambda t: t.name)
            spec = [(t.name, t.is_relay, t.schema) for t in tools]
            blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
            self._digest = hashlib.sha256(blob).hexdigest()[:16]
        return self._digest

    def __repr__(self) -> str:
        return f"Toolkit({', '.join(self._tools)})"


async def create_toolkit(
    *,
    builtins: BuiltinsConfig | None = None,
    extra_tools: Iterable[Tool] = (),
    base_dir: str | Path | None = None,
) -> Toolkit:
    """Builtins (all, unless `builtins` says otherwise) plus your own tools.

    An extra tool may shadow a builtin of the same name, except a relay tool:
    a relay tool named like a builtin is a ToolkitError even with builtins off,
    so that turning builtins on later never changes which side runs a call.
    """
    config = builtins if builtins is not None else BuiltinsConfig()
    extras = list(extra_tools)
    for t in extras:
        if not isinstance(t, Tool):
            raise ToolkitError(f"extra_tools holds {type(t).__name__}, not a Tool")
        if t.is_relay and t.name in BUILTIN_NAMES:
            raise ToolkitError(
                f"relay tool {t.name!r} has the name of the builtin {t.name!r}; "
                "rename the relay tool",
                t.name,
            )
    root = Path(base_dir) if base_dir is not None else Path.cwd()
    if not root.is_dir():
        raise ToolkitError(f"base_dir {str(root)!r} is not a folder")
    shadowed = {t.name for t in extras}
    tools = [t for t in builtin_tools(config) if t.name not in shadowed] + extras
    return Toolkit(tools, base_dir=root.resolve())
