"""The question and todowrite builtins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from relayq import Answer, Request, ToolContext, ToolResult
from relayq.builtins import BuiltinsConfig, builtin_tools


async def _call(
    base: Path, name: str, args: dict[str, Any], answer: Answer | None = None
) -> ToolResult | Request:
    (tool,) = builtin_tools(BuiltinsConfig.only(name))
    ctx = ToolContext(run_id="run_t", call_id="c1", tool_name=name, base_dir=base, answer=answer)
    return await tool.invoke(args, ctx)


# -- question ----------------------------------------------------------------


async def test_question_suspends_with_a_question_request(tmp_path: Path) -> None:
    out = await _call(
        tmp_path, "question", {"question": "Which colour?", "options": ["red", "blue"]}
    )

    assert isinstance(out, Request)
    assert out.kind == "question"
    assert out.prompt == "Which colour?"
    assert out.data == {"options": ["red", "blue"]}


async def test_question_without_options_sends_an_empty_list(tmp_path: Path) -> None:
    out = await _call(tmp_path, "question", {"question": "Why?"})

    assert isinstance(out, Request)
    assert out.data == {"options": []}


async def test_question_resumes_with_the_answer_output(tmp_path: Path) -> None:
    args = {"question": "Which colour?", "options": ["red", "blue"]}
    request = await _call(tmp_path, "question", args)
    assert isinstance(request, Request)

    out = await _call(tmp_path, "question", args, Answer(id=request.id, data={"output": "blue"}))

    assert out == ToolResult(output="blue")


async def test_question_accepts_the_answer_as_text(tmp_path: Path) -> None:
    answer = Answer(id="req_1", data={"text": "because"})

    out = await _call(tmp_path, "question", {"question": "Why?"}, answer)

    assert out == ToolResult(output="because")


@pytest.mark.parametrize("data", [None, {}, {"output": 3}])
async def test_an_answer_without_text_is_an_error(
    tmp_path: Path, data: dict[str, Any] | None
) -> None:
    out = await _call(tmp_path, "question", {"question": "Why?"}, Answer(id="req_1", data=data))

    assert isinstance(out, ToolResult)
    assert out.is_error
    assert "no text" in out.output


async def test_a_declined_answer_is_an_error_if_it_ever_reaches_the_tool(tmp_path: Path) -> None:
    answer = Answer(id="req_1", ok=False, reason="busy")

    out = await _call(tmp_path, "question", {"question": "Why?"}, answer)

    assert isinstance(out, ToolResult)
    assert out.is_error
    assert "busy" in out.output


@pytest.mark.parametrize(
    "args",
    [
        {"question": ""},
        {"question": "Why?", "options": "yes,no"},
        {"question": "Why?", "options": [1]},
    ],
)
async def test_question_with_bad_arguments_is_an_error(
    tmp_path: Path, args: dict[str, Any]
) -> None:
    out = await _call(tmp_path, "question", args)

    assert isinstance(out, ToolResult)
    assert out.is_error


# -- todowrite ---------------------------------------------------------------


async def test_todowrite_renders_the_checklist_with_counts(tmp_path: Path) -> None:
    todos = [
        {"content": "read the code", "status": "completed", "id": "1"},
        {"content": "write the tool", "status": "in_progress", "id": "2"},
        {"content": "write the tests", "status": "pending"},
        {"content": "ship it", "status": "pending"},
    ]

    out = await _call(tmp_path, "todowrite", {"todos": todos})

    assert out == ToolResult(
        output="[x] read the code\n[~] write the tool\n[ ] write the tests\n[ ] ship it\n"
        "4 todos: 1 completed, 1 in progress, 2 pending"
    )


async def test_todowrite_accepts_an_empty_list(tmp_path: Path) -> None:
    out = await _call(tmp_path, "todowrite", {"todos": []})

    assert out == ToolResult(output="The todo list is empty.")


@pytest.mark.parametrize(
    ("todos", "expected"),
    [
        (
            [{"content": "a", "status": "in_progress"}, {"content": "b", "status": "in_progress"}],
            "at most one may be",
        ),
        ([{"content": "a", "status": "done"}], "status 'done'"),
        ([{"content": "   ", "status": "pending"}], "non-empty content"),
        ([{"status": "pending"}], "non-empty content"),
        ([{"content": "a"}], "status None"),
        ([{"content": "a", "status": "pending", "id": 7}], "id must be a string"),
        ([{"content": "a", "status": "pending", "due": "today"}], "unknown field(s) due"),
        (
            [
                {"content": "a", "status": "pending", "id": "x"},
                {"content": "b", "status": "pending", "id": "x"},
            ],
            "repeated: x",
        ),
        (["just a string"], "must be an object"),
        ("not a list", "must be a list"),
    ],
)
async def test_todowrite_rejects_an_invalid_list(tmp_path: Path, todos: Any, expected: str) -> None:
    out = await _call(tmp_path, "todowrite", {"todos": todos})

    assert isinstance(out, ToolResult)
    assert out.is_error
    assert expected in out.output
