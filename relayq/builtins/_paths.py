"""Keeping file tools inside the base directory.

Every path is resolved with its symlinks followed before it is checked, so
`..`, an absolute path, a symlinked file and a symlinked parent folder are all
caught by one comparison against the resolved base directory.
"""

from __future__ import annotations

from pathlib import Path

from relayq._tools import ToolContext
from relayq.builtins._common import ToolFailure

__all__ = ["base_of", "display", "inside", "resolve"]


def base_of(ctx: ToolContext) -> Path:
    """The resolved base directory; read at call time so one tool serves many runs."""
    base = ctx.base_dir.resolve()
    if not base.is_dir():
        raise ToolFailure(f"the base directory {ctx.base_dir} does not exist")
    return base


def resolve(ctx: ToolContext, raw: str) -> Path:
    """`raw` as a resolved path inside the base directory, or a ToolFailure.

    `Path.resolve()` follows every symlink of the existing part of the path and
    keeps the rest as written, which is what a path that does not exist yet needs.
    """
    base = base_of(ctx)
    if raw == "":
        raise ToolFailure("path must not be empty")
    try:
        candidate = Path(raw).expanduser() if raw.startswith("~") else Path(raw)
        full = candidate if candidate.is_absolute() else base / candidate
        resolved = full.resolve()
    except (ValueError, RuntimeError, OSError) as exc:
        # NUL bytes raise ValueError, symlink loops RuntimeError or OSError.
        raise ToolFailure(f"path {raw} cannot be resolved: {exc}") from exc
    if not inside(base, resolved):
        raise ToolFailure(f"path {raw} is outside the base directory")
    return resolved


def inside(base: Path, resolved: Path) -> bool:
    """Whether an already resolved path lies in (or is) the resolved base."""
    return resolved == base or resolved.is_relative_to(base)


def display(base: Path, resolved: Path) -> str:
    """How a path is shown to the model: relative to the base, with `/` separators."""
    try:
        rel = resolved.relative_to(base)
    except ValueError:
        return str(resolved)
    text = rel.as_posix()
    return text if text else "."
