"""An MCP client of the tasks extension, built on the `mcp` SDK's client extension API.

The SDK carries no model of the 2026-07-28 tasks extension: these are its messages
(`tools/call` answered with a task, `tasks/get`, `tasks/update`, `tasks/cancel`), as the
specification writes them, for the tests to drive a task step by step.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client

TASKS = "io.modelcontextprotocol/tasks"


class CreatedTask(types.Result):
    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None


class Task(types.Result):
    result_type: str | None = None
    task_id: str
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    input_requests: dict[str, Any] | None = None
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTask(types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTask(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class CancelTask(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


async def _unresolved(created: CreatedTask, context: ClaimContext) -> types.CallToolResult:
    raise AssertionError("the tests drive tasks with session.call_tool(allow_claimed=True)")


class TasksExtension(ClientExtension):
    """Declares the extension; a `tools/call` answered with a task is the caller's to drive."""

    identifier = TASKS

    def claims(self) -> list[ResultClaim]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_unresolved)]


@contextlib.asynccontextmanager
async def connected(url: str, token: str, *, tasks: bool) -> AsyncIterator[Client]:
    """An SDK client of the server at `url`, with `token`, declaring the tasks extension
    if `tasks`."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http:
        transport = streamable_http_client(url, http_client=http)
        extensions = [TasksExtension()] if tasks else None
        async with Client(transport, extensions=extensions, cache=None) as client:
            yield client


async def start_task(client: Client, tool: str, prompt: str) -> CreatedTask:
    created = await client.session.call_tool(tool, {"prompt": prompt}, allow_claimed=True)
    assert isinstance(created, CreatedTask), created
    return created


async def get_task(client: Client, task_id: str) -> Task:
    return await client.session.send_request(GetTask(params=TaskIdParams(task_id=task_id)), Task)


async def update_task(client: Client, task_id: str, responses: dict[str, Any]) -> list[str]:
    """Send the responses; the keys the server says it ignored (`relayq/ignored`)."""
    params = UpdateParams(task_id=task_id, input_responses=responses)
    result = await client.session.send_request(UpdateTask(params=params), types.EmptyResult)
    return list((result.meta or {}).get("relayq/ignored", []))


async def cancel_task(client: Client, task_id: str) -> None:
    await client.session.send_request(
        CancelTask(params=TaskIdParams(task_id=task_id)), types.EmptyResult
    )
