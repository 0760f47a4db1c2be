"""`relayq mcp`: each registered agent as an MCP tool, `run_<agent>`, over streamable HTTP.

A call starts a durable run. A client that declares the tasks extension
(`io.modelcontextprotocol/tasks`) gets a task at once, whose id is the run's: `tasks/get`
reads the run from the store (so any `relayq mcp` process serves any task), `tasks/update`
answers its relay calls and questions (never an approval: the store's rule,
`relayq.authority`, lets no submitter decide one), `tasks/cancel` cancels it. Any other client gets
the specification's multi round-trip requests: the call waits for the run; when it
suspends, the result is `input_required` with one input request per relay call and a
sealed `requestState` naming the run and its request, and the client's retry with
`inputResponses` answers them and waits again. A run that is still working after
`WAIT` seconds is answered with a `requestState` alone, which the client retries.

Tokens are the API's (`RELAYQ_API_TOKENS`, a bearer token): starting runs takes a
`submitter`'s; a task is its starter's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from api._access import install as hide_secrets_from_access_log
from api._auth import Permission, Principal, Tokens
from api.mcp._delivery import Delivery, delivery_of
from api.mcp._inputs import CALLS_META, TASKS, answer_of, input_requests, task_of
from relayq import ResumeError, UnstorableInput
from relayq.agents import Agent, registered_agents
from relayq.approvals import is_approval
from relayq.authority import refusal
from relayq.relay import is_relay_request
from store import RunRow, StoredRequest
from store.audit import Decider
from store.errors import UnknownRun
from tasks import DurableClient
from tasks.settings import Settings

__all__ = ["IGNORED_META", "WAIT", "WAITING_META", "McpFront", "mcp_app"]

IGNORED_META = "relayq/ignored"
"""Under a `tasks/update` result's `_meta`: the input responses that answered nothing open
(already answered, or not asked), which the extension says to ignore."""

WAIT = 20.0
"""`RELAYQ_MCP_HOLD`'s default: seconds a call without the tasks extension waits for its
run before it answers with a `requestState` to retry with (2026-07-28), or with what the
run waits on (earlier)."""

WAITING_META = "relayq/waiting"
"""Under a handshake-era call's result's `_meta`: the run, what it waits on, where to
answer it."""

DECIDED_EVERY = 1.0
"""Seconds between two looks at an approval a call without the tasks extension waits on."""

_PROMPT_SCHEMA = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "What to ask the agent"}},
    "required": ["prompt"],
}


class TaskIdParams(types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class McpFront:
    """The handlers, over one DurableClient and the API's tokens."""

    def __init__(
        self,
        settings: Settings,
        tokens: Tokens,
        *,
        secret: bytes,
        principal: Principal | None = None,
    ) -> None:
        self.settings = settings
        self.tokens = tokens
        self.principal = principal
        """Who every request is from, where the transport carries no token (stdio); else
        each request's bearer token says."""
        self._client: DurableClient | None = None
        self.server: Server[Any] = Server(
            "relayq",
            lifespan=self._lifespan,
            on_list_tools=self._list_tools,
            # A task is a dict (its `ttlMs` must stay null); the SDK takes one.
            on_call_tool=cast(Any, self._call_tool),
        )
        self.server.add_request_handler("tasks/get", TaskIdParams, self._get_task)
        self.server.add_request_handler("tasks/update", UpdateTaskParams, self._update_task)
        self.server.add_request_handler("tasks/cancel", TaskIdParams, self._cancel_task)
        self.server.extensions[TASKS] = {}
        security = RequestStateSecurity(keys=[secret], ttl=3600.0, bind_principal=self._who)
        self.server.middleware.append(RequestStateBoundary(security, default_audience="relayq"))

    @contextlib.asynccontextmanager
    async def _lifespan(self, _server: Server[Any]) -> AsyncIterator[None]:
        """One DurableClient for the server's life, made on its loop and closed with it."""
        hide_secrets_from_access_log()
        self._client = DurableClient(settings=self.settings)
        try:
            yield
        finally:
            client, self._client = self._client, None
            client.close()

    @property
    def client(self) -> DurableClient:
        if self._client is None:
            raise RuntimeError("the MCP server is not running")
        return self._client

    # --- tools --------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        self._principal(ctx, Permission.READ)
        tools = [
            types.Tool(
                name=f"run_{agent.name}",
                description=f"Run the relayq agent {agent.name!r} on a prompt, durably.",
                input_schema=_PROMPT_SCHEMA,
            )
            for agent in registered_agents().values()
        ]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        who = self._principal(ctx, Permission.SUBMIT)
        agent = self._agent(params.name)
        delivery = delivery_of(ctx.protocol_version, ctx.session.client_capabilities)
        if params.task is not None:
            # 2025-11-25's experimental tasks: no tool here declares `taskSupport`, so a
            # call that asks for one is refused as that revision says, starting nothing.
            raise MCPError(
                types.METHOD_NOT_FOUND,
                f"{params.name} does not run as a 2025-11-25 task; on 2026-07-28, declare "
                "the tasks extension (io.modelcontextprotocol/tasks)",
            )
        if params.request_state is not None and delivery is Delivery.ROUND_TRIPS:
            responses = {k: _wire(v) for k, v in (params.input_responses or {}).items()}
            run_id = await self._resume(who, params.request_state, responses)
        else:
            prompt = (params.arguments or {}).get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise MCPError(types.INVALID_PARAMS, "arguments must be {prompt: a text}")
            try:
                run_id = await self.client.start(agent, prompt, started_by=who.name)
            except UnstorableInput as exc:
                raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        if delivery is Delivery.TASK:
            started = await self.client.store.get_run(run_id)
            return {"resultType": "task", **await self._task(who, started)}
        if delivery is Delivery.ELICIT:
            return await self._elicited(ctx, who, run_id)
        if delivery is Delivery.WAITING:
            return await self._waited(who, run_id)
        return await self._settle(who, run_id)

    def _agent(self, tool: str) -> Agent:
        agent = registered_agents().get(tool.removeprefix("run_"))
        if agent is None or not tool.startswith("run_"):
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {tool!r}")
        return agent

    # --- multi round-trip requests -------------------------------------------------------

    async def _resume(self, who: Principal, state: str, responses: dict[str, Any]) -> str:
        """Answer what `responses` answer of the request `state` names; the run's id.
        A state for a request the run no longer waits on is refused, changing nothing."""
        try:
            named = json.loads(state)
            run_id, request_id = str(named["run"]), named.get("request")
        except (ValueError, KeyError, TypeError):
            raise MCPError(types.INVALID_PARAMS, "requestState is not relayq's") from None
        await self._own(who, run_id)
        if request_id is None:
            return run_id  # still working when it was sent: wait again
        stored = await self._open_request(run_id)
        if stored is None or stored.request.id != request_id:
            raise MCPError(
                types.INVALID_PARAMS,
                f"requestState names request {request_id}, which run {run_id} no longer waits on",
            )
        await self._answer(who, stored, responses)
        return run_id

    async def _settle(
        self, who: Principal, run_id: str
    ) -> types.CallToolResult | types.InputRequiredResult:
        moment = await self._next_moment(who, run_id)
        if isinstance(moment, types.CallToolResult):
            return moment
        stored = moment
        if stored is None or not _may_answer(who, stored):
            return types.InputRequiredResult(request_state=json.dumps({"run": run_id}))
        asked = input_requests(stored, await self._schemas(stored.agent))
        return types.InputRequiredResult.model_validate(
            {
                "resultType": "input_required",
                "inputRequests": asked.requests,
                "requestState": json.dumps({"run": run_id, "request": stored.request.id}),
                "_meta": asked.meta,
            }
        )

    async def _next_moment(
        self, who: Principal, run_id: str
    ) -> types.CallToolResult | StoredRequest | None:
        """Within WAIT seconds: the run's end as a result, or the request it waits on that
        `who` may answer; else (still working, or waiting on an approver) what it waits on,
        or None."""
        deadline = time.monotonic() + self.settings.mcp_hold.total_seconds()
        while True:
            with contextlib.suppress(TimeoutError):
                await self.client.settled(run_id, timeout=max(deadline - time.monotonic(), 0))
            result = await self.client.result(run_id)
            if result.status == "done":
                return _text(result.text, error=False)
            if result.status in ("failed", "incomplete", "cancelled"):
                return _text(result.error or f"the run is {result.status}", error=True)
            stored = await self._open_request(run_id) if result.status == "pending" else None
            if stored is None or _may_answer(who, stored) or time.monotonic() >= deadline:
                return stored
            # An approval waits for an approver elsewhere: the call waits for the decision
            # (so the client's retries do not spin), then, the wait begun again (a decision
            # is the run moving on), for the run.
            if await self._decided(stored, within=deadline - time.monotonic()):
                deadline = time.monotonic() + self.settings.mcp_hold.total_seconds()

    # --- handshake-era clients (2024-11-05 to 2025-11-25) ----------------------------------

    async def _waited(self, who: Principal, run_id: str) -> types.CallToolResult:
        """The run's end within WAIT seconds; else a result saying what it waits on."""
        moment = await self._next_moment(who, run_id)
        if isinstance(moment, types.CallToolResult):
            return moment
        return self._waiting(run_id, moment)

    async def _elicited(
        self, ctx: ServerRequestContext[Any], who: Principal, run_id: str
    ) -> types.CallToolResult:
        """Ask the client, inside its call, each question the run's requests put to it, and
        answer them, until the run ends; a question it leaves unanswered for
        `RELAYQ_MCP_ELICIT_WAIT`, or a run still working after WAIT seconds, ends the call
        with what it waits on."""
        while True:
            moment = await self._next_moment(who, run_id)
            if isinstance(moment, types.CallToolResult):
                return moment
            if moment is None or not _may_answer(who, moment):
                return self._waiting(run_id, moment)
            asked = input_requests(moment, await self._schemas(moment.agent))
            responses: dict[str, Any] = {}
            for key, question in asked.requests.items():
                response = await _elicit(
                    ctx,
                    key,
                    question["params"],
                    asked.details[key],
                    within=self.settings.mcp_elicit_wait.total_seconds(),
                )
                if response is None:
                    return self._waiting(run_id, moment)
                responses[key] = response
            try:
                await self._answer(who, moment, responses)
            except MCPError:
                # Answered meanwhile elsewhere (the inbox, another call): wait on the run.
                if await self._open_request(run_id) == moment:
                    raise

    def _waiting(self, run_id: str, stored: StoredRequest | None) -> types.CallToolResult:
        """Not an error: the run goes on, and this says where."""
        site = self.settings.webhooks.public_url.rstrip("/")
        if stored is None:
            text = f"Run {run_id} is still working: follow it at {site}/runs/{run_id}"
            meta: dict[str, Any] = {"run": run_id, "status": "working"}
        else:
            rid = stored.request.id
            page = f"{site}/requests/{rid}"
            kind = stored.request.kind
            text = f"Run {run_id} is waiting on request {rid} ({kind}): answer it at {page}"
            meta = {"run": run_id, "status": "pending", "request": rid, "answerAt": page}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            is_error=False,
            _meta={WAITING_META: meta},
        )

    # --- the tasks extension ---------------------------------------------------------------

    async def _get_task(
        self, ctx: ServerRequestContext[Any], params: TaskIdParams
    ) -> dict[str, Any]:
        who, run = await self._task_caller(ctx, params.task_id)
        return {"resultType": "complete", **await self._task(who, run)}

    async def _update_task(
        self, ctx: ServerRequestContext[Any], params: UpdateTaskParams
    ) -> dict[str, Any]:
        who, _ = await self._task_caller(ctx, params.task_id)
        stored = await self._open_request(params.task_id)
        taken = await self._answer(who, stored, params.input_responses) if stored else set()
        ignored = sorted(set(params.input_responses) - taken)
        if not ignored:
            return {"resultType": "complete"}
        # The extension ignores what answers nothing open; the caller is told which.
        return {"resultType": "complete", "_meta": {IGNORED_META: ignored}}

    async def _cancel_task(
        self, ctx: ServerRequestContext[Any], params: TaskIdParams
    ) -> dict[str, Any]:
        await self._task_caller(ctx, params.task_id)
        await self.client.cancel(params.task_id)
        return {"resultType": "complete"}

    async def _task_caller(
        self, ctx: ServerRequestContext[Any], task_id: str
    ) -> tuple[Principal, RunRow]:
        """Who asks about `task_id` (a known token, a client of the extension, the task's
        starter) and its run; else the error that says which is missing."""
        who = self._principal(ctx, Permission.READ)
        _require_tasks(ctx)
        return who, await self._own(who, task_id)

    async def _task(self, who: Principal, run: RunRow) -> dict[str, Any]:
        run_id = run.id
        result = await self.client.result(run_id)
        asked, waiting = None, None
        if result.status == "pending":
            stored = await self._open_request(run_id)
            if stored is not None and _may_answer(who, stored):
                asked = input_requests(stored, await self._schemas(stored.agent))
            elif stored is not None:
                waiting = f"waiting for an approver to decide request {stored.request.id}"
        return task_of(
            run_id,
            result.status,
            created=run.created_at,
            updated=run.updated_at,
            text=result.text,
            error=result.error,
            asked=asked,
            waiting=waiting,
        )

    # --- shared ---------------------------------------------------------------------------

    async def _answer(
        self, who: Principal, stored: StoredRequest, responses: dict[str, Any]
    ) -> set[str]:
        """Answer what `responses` answer of `stored`; the keys it took (the others answer
        nothing it asks, and are ignored, as the extension says)."""
        try:
            answer = answer_of(stored, responses)
        except ValueError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        if answer is None:
            return set()
        decider = Decider(name=who.name, role=who.role, groups=tuple(who.groups), via="api")
        approval = is_approval(stored.request)
        try:
            await self.client.submit_answer(
                answer,
                partial=is_relay_request(stored.request),
                decider=decider,
                decision=approval,
            )
        except ResumeError as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        return set(responses) & set(input_requests(stored, {}).requests)

    async def _decided(self, stored: StoredRequest, *, within: float) -> bool:
        """Whether `stored` was decided (is no longer open) within `within` seconds."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await asyncio.sleep(min(DECIDED_EVERY, max(deadline - time.monotonic(), 0)))
            if await self._open_request(stored.run_id) != stored:
                return True
        return False

    async def _open_request(self, run_id: str) -> StoredRequest | None:
        open_now = await self.client.requests("open", run_id=run_id)
        return open_now[0] if open_now else None

    async def _own(self, who: Principal, run_id: str) -> RunRow:
        """The run, when it is the caller's; else the same error as for no such task."""
        try:
            run = await self.client.store.get_run(run_id)
        except UnknownRun:
            run = None
        if run is None or run.started_by != who.name:
            raise MCPError(types.INVALID_PARAMS, f"no task {run_id!r}")
        return run

    async def _schemas(self, agent_name: str) -> dict[str, dict[str, Any]]:
        agent = registered_agents().get(agent_name)
        if agent is None or agent.mcp_servers:
            return {}  # its tools are listed on the workers
        return {t.name: t.schema for t in (await agent.toolkit()).tools if t.is_relay}

    def _principal(self, ctx: ServerRequestContext[Any], permission: Permission) -> Principal:
        who = self._lookup(ctx)
        if who is None:
            raise MCPError(types.INVALID_REQUEST, "a valid bearer token is required")
        if not who.may(permission):
            raise MCPError(types.INVALID_REQUEST, f"the token's role {who.role!r} may not do this")
        return who

    def _who(self, ctx: ServerRequestContext[Any]) -> str | None:
        who = self._lookup(ctx)
        return None if who is None else who.name

    def _lookup(self, ctx: ServerRequestContext[Any]) -> Principal | None:
        if self.principal is not None:
            return self.principal
        request = ctx.request
        header = request.headers.get("authorization", "") if request is not None else ""
        scheme, _, token = header.partition(" ")
        return self.tokens.lookup(token) if scheme.lower() == "bearer" and token else None


def _may_answer(who: Principal, stored: StoredRequest) -> bool:
    """Whether the run's starter `who` may answer `stored` (the store's rule, asked first
    so that an approval is never offered to one who may not decide it)."""
    return refusal(who.role, stored.request.kind, starter=True) is None


def _wire(response: Any) -> Any:
    """An input response as the JSON it came as (the SDK parses those of multi round-trip
    retries into its models)."""
    if isinstance(response, BaseModel):
        return response.model_dump(mode="json", by_alias=True, exclude_none=True)
    return response


async def _elicit(
    ctx: ServerRequestContext[Any],
    key: str,
    params: dict[str, Any],
    about: dict[str, Any],
    *,
    within: float,
) -> dict[str, Any] | None:
    """The client's answer to one question, as an input response; None if it gave none
    within `within` seconds (or its session has no way back for a request)."""
    request = types.ElicitRequest(
        params=types.ElicitRequestFormParams(
            message=params["message"],
            requested_schema=params["requestedSchema"],
            _meta={CALLS_META: {key: about}},
        )
    )
    try:
        result = await ctx.session.send_request(
            request,
            types.ElicitResult,
            request_read_timeout_seconds=within,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
        )
    except (MCPError, ValidationError):  # NoBackChannelError among the first
        return None
    return _wire(result)


def _declared_tasks(ctx: ServerRequestContext[Any]) -> bool:
    capabilities = ctx.session.client_capabilities
    return bool(capabilities is not None and TASKS in (capabilities.extensions or {}))


def _require_tasks(ctx: ServerRequestContext[Any]) -> None:
    if not _declared_tasks(ctx):
        raise MCPError(
            types.MISSING_REQUIRED_CLIENT_CAPABILITY,
            "tasks/* needs the tasks extension declared",
            {"requiredCapabilities": {"extensions": {TASKS: {}}}},
        )


def _text(text: str, *, error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


class _BearerOnly:
    """401 for an HTTP request without a known bearer token, 403 for a token whose role
    may use no MCP method, before the SDK reads it."""

    def __init__(self, app: ASGIApp, tokens: Tokens) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            scheme, _, token = header.partition(" ")
            who = self.tokens.lookup(token) if scheme.lower() == "bearer" else None
            refused = None
            if who is None:
                refused = JSONResponse({"detail": "a valid bearer token is required"}, 401)
            elif not who.may(Permission.READ):
                # A host's door is the relay API: MCP serves those who read and submit.
                detail = f"role {who.role!r} may not use MCP: its door is /api/relay"
                refused = JSONResponse({"detail": detail}, 403)
            if refused is not None:
                await refused(scope, receive, send)
                return
            # A handshake-era session is its opener's alone: the SDK serves a session's
            # requests only to the principal that opened it (another's token: 404).
            assert who is not None
            scope["user"] = AuthenticatedUser(
                AccessToken(token=who.name, client_id=who.name, scopes=[who.role])
            )
        await self.app(scope, receive, send)


def mcp_app(front: McpFront, *, host: str = "127.0.0.1") -> ASGIApp:
    """The ASGI app serving `front` at `/mcp`. A 2026-07-28 request stands alone; a client
    of an earlier revision gets a session (`Mcp-Session-Id`), which carries what it
    declared at `initialize` and the way back for the server's elicitations: it lives in
    this process, so a deployment of several routes a session's requests to one."""
    app: Starlette = front.server.streamable_http_app(stateless_http=False, host=host)
    return _BearerOnly(app, front.tokens)
