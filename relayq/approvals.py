"""Structured approvals: a local tool that runs only once people have approved the call.

    refund = requires_approval(
        define_tool("refund", "Refund an order", SCHEMA, do_refund),
        approvers=["finance"], quorum=2, expires_in=timedelta(hours=4),
    )

A call of a wrapped tool suspends its run with one Request of kind
`tool_approval` carrying the tool's name, the arguments the model gave, the
tool's JSON schema and the policy. A decision is typed, never free text:

- approve: the tool runs with the arguments as the model gave them;
- edit: the tool runs with edited arguments, checked against the tool's schema
  before the decision is taken; the model is told what was changed;
- decline, with a reason: the tool does not run; the model gets an error
  result carrying the reason.

The answer's wire shape: `{"data": {"decision": "approve"}}`,
`{"data": {"decision": "edit", "arguments": {...}}}`, or
`{"ok": false, "reason": "..."}`. Who may decide, and how many must agree,
is the store's to enforce (`store.votes`); everything here is pure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel

from relayq._errors import AnswerMismatch, ToolkitError
from relayq._tools import Tool, ToolContext
from relayq._types import Answer, Request, ToolResult
from relayq.grants import MAX_GRANT_FOR, GrantCaps, GrantScope
from relayq.matching import parse_constraints
from relayq.policies import (
    Deny,
    Predicate,
    Refuse,
    Rules,
    RunUnasked,
    Validate,
    arguments_digest,
    denial,
    denied_by,
    misfit,
    note,
    screen,
)

__all__ = [
    "APPROVAL_KIND",
    "BUDGET_KIND",
    "DECISIONS",
    "Decision",
    "DecisionKind",
    "EscalationStep",
    "OnApprovalExpiry",
    "Policy",
    "approve",
    "arguments_digest",
    "arguments_of",
    "decision_of",
    "decline",
    "diff_arguments",
    "edit",
    "is_approval",
    "is_tool_approval",
    "policy_of",
    "requires_approval",
]

APPROVAL_KIND = "tool_approval"
BUDGET_KIND = "budget"
"""A run asking to spend more than its budget (`relayq.budgets`): decided as an approval."""

OnApprovalExpiry: TypeAlias = Literal["decline", "escalate", "stay_open"]
DecisionKind: TypeAlias = Literal["approve", "edit", "decline"]
DECISIONS: tuple[DecisionKind, ...] = ("approve", "edit", "decline")
"""Every decision a person can take, in the order the doors offer them."""


@dataclass(frozen=True, kw_only=True)
class EscalationStep:
    """Where an expired approval goes next: to `approvers`, with a new deadline."""

    approvers: tuple[str, ...]
    expires_in: timedelta

    def to_wire(self) -> dict[str, Any]:
        return {"approvers": list(self.approvers), "expiresIn": self.expires_in.total_seconds()}


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Who may decide a tool's calls, how many must agree, and what time does."""

    approvers: tuple[str, ...] = ()
    """Groups whose members may decide; empty: anyone allowed to answer requests."""
    quorum: int = 1
    """Distinct approvals that resolve the request."""
    declines: int = 1
    """Distinct declines that resolve it declined."""
    forbid_self_approval: bool = False
    """The identity that started the run may not decide its requests."""
    expires_in: timedelta | None = None
    remind_before: timedelta | None = None
    """A `request.reminder` this long before the deadline."""
    on_expiry: OnApprovalExpiry = "decline"
    """At the deadline: decline (outcome `expired`), escalate along `escalation`, or stay open."""
    escalation: tuple[EscalationStep, ...] = ()
    decisions: tuple[DecisionKind, ...] = DECISIONS
    """What a person may decide (every door offers only these, and refuses the others)."""
    deny: tuple[str, ...] = ()
    """The tool's deny rules (`relayq.matching` constraints): an edit meeting one is refused."""
    grants: GrantCaps = field(default_factory=GrantCaps)
    """What standing grants may do for the tool (`relayq.grants`)."""

    def __post_init__(self) -> None:
        if self.quorum < 1 or self.declines < 1:
            raise ToolkitError("quorum and declines must be at least 1")
        unknown = [d for d in self.decisions if d not in DECISIONS]
        if unknown or not self.decisions or len(set(self.decisions)) != len(self.decisions):
            raise ToolkitError(
                f"decisions are some of {', '.join(DECISIONS)}, each once; "
                f"not {', '.join(map(repr, self.decisions)) or 'none'}"
            )
        if self.on_expiry not in ("decline", "escalate", "stay_open"):
            raise ToolkitError(
                f"on_expiry must be 'decline', 'escalate' or 'stay_open', not {self.on_expiry!r}"
            )
        if self.on_expiry == "escalate" and not self.escalation:
            raise ToolkitError("on_expiry='escalate' needs at least one escalation step")
        if any(not isinstance(g, str) or not g for g in self.approvers):
            raise ToolkitError("approver groups are non-empty strings")
        parse_constraints(list(self.deny))

    def to_wire(self) -> dict[str, Any]:
        return {
            "approvers": list(self.approvers),
            "quorum": self.quorum,
            "declines": self.declines,
            "forbidSelfApproval": self.forbid_self_approval,
            "remindBefore": _seconds(self.remind_before),
            "onExpiry": self.on_expiry,
            "escalation": [step.to_wire() for step in self.escalation],
            "decisions": list(self.decisions),
            "deny": list(self.deny),
            **self.grants.to_wire(),
        }


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


def policy_of(request: Request) -> Policy:
    """The policy a `tool_approval` request carries (defaults for anything absent).

    Its deadline is the request's own `expires_at`; `expires_in` is not kept.
    """
    wire = request.data.get("policy") or {}
    remind = wire.get("remindBefore")
    return Policy(
        approvers=tuple(wire.get("approvers") or ()),
        quorum=int(wire.get("quorum", 1)),
        declines=int(wire.get("declines", 1)),
        forbid_self_approval=bool(wire.get("forbidSelfApproval", False)),
        remind_before=None if remind is None else timedelta(seconds=float(remind)),
        on_expiry=wire.get("onExpiry", "decline"),
        escalation=tuple(
            EscalationStep(
                approvers=tuple(step["approvers"]),
                expires_in=timedelta(seconds=float(step["expiresIn"])),
            )
            for step in wire.get("escalation") or ()
        ),
        decisions=tuple(wire.get("decisions") or DECISIONS),
        deny=tuple(wire.get("deny") or ()),
        grants=GrantCaps.from_wire(wire),
    )


def is_approval(request: Request) -> bool:
    """Whether `request` is decided by approve / edit / decline votes: a tool's call
    awaiting approval, or a run asking for more budget."""
    return request.kind in (APPROVAL_KIND, BUDGET_KIND)


def is_tool_approval(request: Request) -> bool:
    return request.kind == APPROVAL_KIND


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One approver's decision on a `tool_approval` request."""

    kind: Literal["approve", "edit", "decline"]
    arguments: dict[str, Any] | None = None
    """The edited arguments (an `edit` only)."""
    reason: str | None = None
    """Why it was declined (a `decline` only)."""


def approve(request_id: str) -> Answer:
    """Approve the call as the model made it."""
    return Answer(id=request_id, data={"decision": "approve"})


def edit(request_id: str, arguments: dict[str, Any]) -> Answer:
    """Approve the call with `arguments` in place of the model's."""
    return Answer(id=request_id, data={"decision": "edit", "arguments": arguments})


def decline(request_id: str, reason: str) -> Answer:
    """Decline the call, saying why: the tool does not run."""
    return Answer(id=request_id, ok=False, reason=reason)


def decision_of(request: Request, answer: Answer) -> Decision:
    """The typed decision an answer to `request` carries; AnswerMismatch if it is not one
    (free text, edited arguments that do not fit the tool's schema, a decline without
    a reason)."""
    if not answer.ok:
        _allowed(request, "decline")
        reason = (answer.reason or "").strip()
        if not reason:
            raise AnswerMismatch(f"declining {request.id} takes a reason", request.id)
        return Decision(kind="decline", reason=reason)
    data = answer.data or {}
    kind = data.get("decision")
    extra = sorted(set(data) - {"decision", "arguments"})
    if kind not in ("approve", "edit") or extra:
        raise AnswerMismatch(
            f"an answer to approval {request.id} is a decision: "
            '{"decision": "approve"}, {"decision": "edit", "arguments": {...}}, '
            'or {"ok": false, "reason": "..."}',
            request.id,
        )
    _allowed(request, kind)
    if kind == "approve":
        if "arguments" in data:
            raise AnswerMismatch(
                f"approving {request.id} takes no arguments; edit to change them", request.id
            )
        return Decision(kind="approve")
    arguments = data.get("arguments")
    if not isinstance(arguments, dict):
        raise AnswerMismatch(f"an edit of {request.id} takes an arguments object", request.id)
    _check_schema(request, arguments)
    _check_policy(request, arguments)
    return Decision(kind="edit", arguments=arguments)


def _allowed(request: Request, kind: DecisionKind) -> None:
    """AnswerMismatch, naming what may be decided, for a decision the policy leaves out."""
    allowed = policy_of(request).decisions
    if kind not in allowed:
        raise AnswerMismatch(
            f"{request.id} may be decided by {', '.join(allowed)} only, not {kind}", request.id
        )


def _check_schema(request: Request, arguments: dict[str, Any]) -> None:
    fits = "the budget's limits" if request.kind == BUDGET_KIND else "the tool's schema"
    _check_against(request, request.data.get("schema") or {"type": "object"}, arguments, fits)


def _check_policy(request: Request, arguments: dict[str, Any]) -> None:
    """An edit is put through the policy's rules the door can read: the deny rules, and the
    JSON schema of a pydantic `validate=`."""
    denied = denial(parse_constraints(list(policy_of(request).deny)), arguments)
    if denied is not None and not denied.told:
        raise AnswerMismatch(f"the edited arguments of {request.id}: {denied.reason}", request.id)
    if denied is not None:
        raise AnswerMismatch(
            f"the edited arguments of {request.id} are refused by the tool's policy: "
            f"{denied.reason}",
            request.id,
        )
    validates = request.data.get("validates")
    if isinstance(validates, dict):
        _check_against(request, validates, arguments, "the tool's validation")


def _check_against(
    request: Request, schema: dict[str, Any], arguments: dict[str, Any], fits: str
) -> None:
    import jsonschema  # a tenth of a second at every process's start, for approvals' edits only

    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path) or "(the arguments)"
        raise AnswerMismatch(
            f"the edited arguments of {request.id} do not fit {fits}: "
            f"{where}: {first.message[:200]}",
            request.id,
        )


def arguments_of(request: Request) -> dict[str, Any]:
    """The arguments the model gave the call."""
    return dict(request.data.get("arguments") or {})


def diff_arguments(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    """What an edit changed, key by key: `{key: [before, after]}` (absent is None)."""
    keys = sorted(set(before) | set(after))
    return {k: [before.get(k), after.get(k)] for k in keys if before.get(k) != after.get(k)}


Prompt: TypeAlias = "str | Callable[[dict[str, Any]], str] | None"


def requires_approval(
    tool: Tool,
    *,
    approvers: Sequence[str] | None = None,
    quorum: int = 1,
    declines: int = 1,
    forbid_self_approval: bool = False,
    expires_in: timedelta | None = None,
    remind_before: timedelta | None = None,
    on_expiry: OnApprovalExpiry = "decline",
    escalation: Sequence[EscalationStep] = (),
    prompt: Prompt = None,
    decisions: Sequence[DecisionKind] = DECISIONS,
    deny: Deny = None,
    validate: Validate = None,
    when: Predicate | None = None,
    grantable: bool = True,
    grant_covers_quorum: bool = False,
    max_grant_scope: GrantScope = "all",
    max_grant_for: timedelta = MAX_GRANT_FOR,
) -> Tool:
    """`tool`, run only once its call is approved, with the approved arguments.

    Each call goes through the policy's steps in order (`relayq.policies`): `deny`
    (constraints such as `["amount > 10000"]`, or a predicate `(args, ctx)`) refuses it
    at once; `validate` (a pydantic model, or a function that raises) sends arguments
    that misfit back to the model; `when` (a predicate `(args, ctx)`) false runs it
    without asking; a standing grant may approve it (unless `grantable=False`); else a
    person is asked. `grantable=False` keeps every grant off the tool; a grant stands for a
    quorum only with `grant_covers_quorum`; `max_grant_scope` and `max_grant_for` cap
    what a grant for it may cover and how long it may last. `prompt` is the line a person
    reads (a string, or a function of the arguments); by default the tool's name and
    description. `decisions` is what a person may decide (say `("approve", "decline")`:
    no edits); every door refuses the others.
    An approver's edit is checked against the schema, the deny rules and a pydantic
    `validate` at every door, and against the predicates before the tool runs with it.
    """
    if tool.fn is None:
        raise ToolkitError(f"relay tool {tool.name!r} is run by its host; it needs no approval")
    if remind_before is not None and expires_in is None:
        raise ToolkitError("remind_before needs expires_in: a reminder comes before a deadline")
    caps = GrantCaps(
        grantable=grantable,
        covers_quorum=grant_covers_quorum,
        max_scope=max_grant_scope,
        max_for=max_grant_for,
    )
    rules = Rules.of(
        deny=deny,
        validate=validate,
        when=when,
        caps=caps,
        quorum=quorum,
        approvers=tuple(approvers or ()),
        forbid_self_approval=forbid_self_approval,
    )
    policy = Policy(
        approvers=tuple(approvers or ()),
        quorum=quorum,
        declines=declines,
        forbid_self_approval=forbid_self_approval,
        expires_in=expires_in,
        remind_before=remind_before,
        on_expiry=on_expiry,
        escalation=tuple(escalation),
        decisions=tuple(decisions),
        deny=tuple(str(rule) for rule in rules.deny_rules),
        grants=caps,
    )
    validates = None
    if isinstance(validate, type) and issubclass(validate, BaseModel):
        validates = validate.model_json_schema()

    async def gated(args: dict[str, Any], ctx: ToolContext) -> ToolResult | Request:
        if ctx.answer is not None:
            return await _decided(tool, args, ctx, ctx.answer, rules)
        screened = await screen(rules, tool.name, args, ctx)
        if isinstance(screened, Refuse):
            return ToolResult.error(screened.message)
        if isinstance(screened, RunUnasked):
            return await _run(tool, args, ctx)
        if callable(prompt):  # the user's code: on a thread, never on the loop
            request = await asyncio.to_thread(_ask, tool, policy, prompt, args, validates)
        else:
            request = _ask(tool, policy, prompt, args, validates)
        if screened.why is not None:
            await note(ctx, tool.name, args, "asked", "policy", screened.why, request_id=request.id)
        return request

    return Tool(name=tool.name, description=tool.description, schema=tool.schema, fn=gated)


async def _decided(
    tool: Tool, args: dict[str, Any], ctx: ToolContext, answer: Answer, rules: Rules
) -> ToolResult:
    """The gated call once decided: declined, or run with the arguments approved."""
    asked = Request(id=answer.id, kind=APPROVAL_KIND, prompt="", data={"schema": tool.schema})
    decision = decision_of(asked, answer)
    if decision.kind == "decline":
        return ToolResult.error(f"declined by the approver: {decision.reason}")
    if decision.arguments is None:
        return await _run(tool, args, ctx)
    edited = decision.arguments
    refused = await _edit_refused(rules, edited, ctx)
    if refused is not None:
        return ToolResult.error(
            f"{tool.name} did not run: the approver's edit of its arguments {refused}"
        )
    out = await _run(tool, edited, ctx)
    changes = diff_arguments(args, edited)
    said = ", ".join(f"{k}: {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in changes.items())
    note_ = f"[The approver changed the arguments before {tool.name} ran: {said}]\n"
    return ToolResult(output=note_ + out.output, is_error=out.is_error)


async def _edit_refused(rules: Rules, edited: dict[str, Any], ctx: ToolContext) -> str | None:
    """Why an approver's edit may not run (the policy's deny and validate steps), or None.

    The doors checked the rules they can read (`decision_of`); a predicate or a function
    is the tool's code, checked here. One that raises refuses: an edit is not asked
    about again.
    """
    ruled = denial(rules.deny_rules, edited)
    if ruled is not None:
        return f"is refused by its policy ({ruled.reason})"
    try:
        denied = await denied_by(rules.deny, edited, ctx)
    except Exception as exc:
        return f"could not be checked against its policy ({type(exc).__name__}: {str(exc)[:200]})"
    if denied:
        return f"is refused by its policy ({denied})"
    wrong = await misfit(rules.validate, edited)
    if wrong is not None:
        return f"does not fit ({wrong})"
    return None


async def _run(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    out = await tool.invoke(args, dataclasses.replace(ctx, answer=None))
    if isinstance(out, Request):
        return ToolResult.error(
            f"tool {tool.name!r} asked for more after its approval; "
            "a tool that requires approval cannot suspend again"
        )
    return out


def _ask(
    tool: Tool,
    policy: Policy,
    prompt: Prompt,
    args: dict[str, Any],
    validates: dict[str, Any] | None,
) -> Request:
    if callable(prompt):
        line = prompt(args)
    elif prompt is not None:
        line = prompt
    else:
        line = f"Approve {tool.name}: {tool.description}"
    expires_at = None
    if policy.expires_in is not None:
        expires_at = datetime.now(UTC) + policy.expires_in
    data = {"tool": tool.name, "arguments": args, "schema": tool.schema}
    if validates is not None:
        data["validates"] = validates
    data["policy"] = policy.to_wire()
    return Request(kind=APPROVAL_KIND, prompt=line, data=data, expires_at=expires_at)
