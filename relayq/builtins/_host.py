"""Builtins that talk to the host rather than the machine: question and todowrite."""

from __future__ import annotations

from typing import Any

from relayq._tools import Tool, ToolContext
from relayq._types import Request, ToolResult, pending
from relayq.builtins._common import ToolFailure, req_str, sync_builtin, truncate
from relayq.builtins._config import BuiltinsConfig

__all__ = ["question_tool", "todowrite_tool"]

# -- question ----------------------------------------------------------------

_QUESTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "question": {
            "type": "string",
            "description": "The question for the user, complete enough to answer on its own.",
        },
        "options": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Suggested answers to choose from, if the answer is a choice.",
        },
    },
    "required": ["question"],
    "additionalProperties": False,
}


def question_tool(config: BuiltinsConfig) -> Tool:
    def question(args: dict[str, Any], ctx: ToolContext) -> Request | ToolResult:
        text = req_str(args, "question")
        options = _options(args.get("options"))
        if ctx.answer is None:
            return pending("question", text, {"options": options})
        if not ctx.answer.ok:
            # The loop settles declined answers itself; this only guards direct callers.
            return ToolResult.error(f"the user declined to answer: {ctx.answer.reason or ''}")
        return _answer_text(ctx.answer.data or {})

    return sync_builtin(
        "question",
        "Ask the user a question and wait for the answer, which becomes this call's "
        "result. Use it when you cannot go on without a decision or a fact only the "
        "user has; offer options when the answer is a choice.",
        _QUESTION_SCHEMA,
        question,
    )


def _options(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(o, str) and o for o in value):
        raise ToolFailure("argument 'options' must be a list of non-empty strings")
    return list(value)


def _answer_text(data: dict[str, Any]) -> ToolResult:
    for key in ("output", "text"):
        value = data.get(key)
        if isinstance(value, str):
            return ToolResult(output=value)
    return ToolResult.error("the answer carried no text (expected data.output or data.text)")


# -- todowrite ---------------------------------------------------------------

_MARKS = {"pending": "[ ] ", "in_progress": "[~] ", "completed": "[x] "}

_TODO_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "todos": {
            "type": "array",
            "description": "The whole list, every time: items left out are dropped.",
            "items": {
                "type": "object",
                "properties": {
                    "content": {"type": "string", "description": "What to do, in one line."},
                    "status": {
                        "type": "string",
                        "enum": list(_MARKS),
                        "description": "At most one item may be in_progress.",
                    },
                    "id": {"type": "string", "description": "Optional stable id."},
                },
                "required": ["content", "status"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["todos"],
    "additionalProperties": False,
}


def todowrite_tool(config: BuiltinsConfig) -> Tool:
    def todowrite(args: dict[str, Any], ctx: ToolContext) -> str:
        todos = args.get("todos")
        if not isinstance(todos, list):
            raise ToolFailure("argument 'todos' must be a list of {content, status, id?} items")
        items = [_todo(n, item) for n, item in enumerate(todos, start=1)]
        _check_list(items)
        return truncate(_render(items), config.max_output_chars)

    return sync_builtin(
        "todowrite",
        "Write your task checklist: send the whole list each time, with each item's "
        "status (pending, in_progress or completed). Keep at most one item in_progress. "
        "Returns the rendered checklist.",
        _TODO_SCHEMA,
        todowrite,
    )


def _todo(n: int, item: object) -> tuple[str, str, str | None]:
    if not isinstance(item, dict):
        raise ToolFailure(f"todo {n} must be an object with content and status")
    unknown = sorted(set(item) - {"content", "status", "id"})
    if unknown:
        raise ToolFailure(f"todo {n} has unknown field(s) {', '.join(unknown)}")
    content, status, ident = item.get("content"), item.get("status"), item.get("id")
    if not isinstance(content, str) or not content.strip():
        raise ToolFailure(f"todo {n} needs a non-empty content")
    if status not in _MARKS:
        raise ToolFailure(f"todo {n} has status {status!r}; use one of {', '.join(_MARKS)}")
    if ident is not None and not isinstance(ident, str):
        raise ToolFailure(f"todo {n}: id must be a string")
    return content.strip(), str(status), ident


def _check_list(items: list[tuple[str, str, str | None]]) -> None:
    doing = [n for n, (_, status, _) in enumerate(items, start=1) if status == "in_progress"]
    if len(doing) > 1:
        raise ToolFailure(
            f"{len(doing)} todos are in_progress (items {', '.join(map(str, doing))}); "
            "at most one may be"
        )
    ids = [ident for _, _, ident in items if ident is not None]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ToolFailure(f"todo ids must be unique; repeated: {', '.join(dupes)}")


def _render(items: list[tuple[str, str, str | None]]) -> str:
    if not items:
        return "The todo list is empty."
    lines = [_MARKS[status] + content for content, status, _ in items]
    counts = {s: sum(1 for _, status, _ in items if status == s) for s in _MARKS}
    lines.append(
        f"{len(items)} todos: {counts['completed']} completed, "
        f"{counts['in_progress']} in progress, {counts['pending']} pending"
    )
    return "\n".join(lines)
