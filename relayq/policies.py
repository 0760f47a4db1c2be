"""When a gated call needs a person: a policy evaluated in one fixed order.

On every call of a tool wrapped with `relayq.approvals.requires_approval`:

1. `deny=`: rules (`relayq.matching` constraints) or a predicate; a call it denies is
   refused at once, the model gets an error result, and no person is asked;
2. `validate=`: arguments that misfit go back to the model, which can correct them;
3. `when=`: a predicate of the arguments and the call's context; false runs the tool
   without asking;
4. a standing grant that matches approves the call (`Gatekeeper.use_grant`);
5. otherwise a person is asked.

A predicate that raises asks a person (the policy fails closed), and the audit trail
says why. Every step decided without a person is told to the `Gatekeeper`, which the
durable worker writes to the audit trail (`through: "policy"` or `"grant:<id>"`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import BaseModel, ValidationError

from relayq._errors import ToolkitError
from relayq.grants import GrantCaps
from relayq.matching import Constraint, parse_constraints

if TYPE_CHECKING:
    from relayq._tools import ToolContext

__all__ = [
    "Ask",
    "Deny",
    "Gatekeeper",
    "GrantAsk",
    "Predicate",
    "PolicyNote",
    "Refuse",
    "Rules",
    "RunUnasked",
    "Screened",
    "Validate",
    "Denied",
    "arguments_digest",
    "denial",
    "denied_by",
    "misfit",
    "note",
    "screen",
]

Predicate: TypeAlias = "Callable[[dict[str, Any], ToolContext], object]"
"""`(args, ctx) -> bool` (or an awaitable of one); sync ones run on a thread."""
Deny: TypeAlias = "Predicate | Sequence[str] | None"
"""Constraints any one of which denies (`["amount > 10000"]`), or a predicate whose true
result denies (a string result is the reason the model is told)."""
Validate: TypeAlias = "Callable[[dict[str, Any]], object] | type[BaseModel] | None"
"""Checks a call's arguments before anyone is asked: a pydantic model they must fit, or a
function (sync or async) that raises when they do not."""

Outcome: TypeAlias = Literal["denied", "approved", "asked"]


@dataclass(frozen=True, kw_only=True)
class PolicyNote:
    """What a policy decided on a call without a person, for the audit trail."""

    run_id: str
    call_id: str
    call_key: str
    """The call's `ToolContext.idempotency_key`: one note per call, however often it runs."""
    agent: str
    tool: str
    outcome: Outcome
    through: str
    """`policy`, or `grant:<id>`."""
    reason: str
    arguments_hash: str
    request_id: str | None = None
    """The request a person was asked with (an `asked` note)."""


@dataclass(frozen=True, kw_only=True)
class GrantAsk:
    """A call a standing grant might approve."""

    run_id: str
    call_id: str
    call_key: str
    agent: str
    tool: str
    arguments: dict[str, Any]
    arguments_hash: str
    conversation_id: str | None
    started_by: str | None
    caps: GrantCaps
    """What the tool's policy lets a grant do: a grant past them approves nothing."""
    quorum: int = 1
    approvers: tuple[str, ...] = ()
    """The tool's approver groups: a grant made for none of them does not cover the call."""
    forbid_self_approval: bool = False
    """A grant made by the run's own starter does not cover the call."""


class Gatekeeper:
    """Where a gated call's policy meets what is kept: the audit trail and the grants.

    The base class keeps nothing and holds no grants, which is right in-process; the
    durable worker's (`tasks.runner.turn.gatekeeper`) writes to the store.
    """

    async def note(self, note: PolicyNote) -> None:
        """A call decided without a person: denied, run unasked, or asked because a
        predicate raised."""

    async def use_grant(self, ask: GrantAsk) -> str | None:
        """The id of a standing grant that approves the call, its use counted and noted in
        one transaction; None: no grant does (none matches, or each is revoked, expired
        or used up). Asked again for the same call, the grant it used then, not counted
        again."""
        return None


@dataclass(frozen=True, kw_only=True)
class Rules:
    """A gated tool's policy, before a person."""

    deny_rules: tuple[Constraint, ...] = ()
    deny: Predicate | None = None
    validate: Validate = None
    when: Predicate | None = None
    caps: GrantCaps = field(default_factory=GrantCaps)
    quorum: int = 1
    approvers: tuple[str, ...] = ()
    forbid_self_approval: bool = False

    @classmethod
    def of(
        cls,
        *,
        deny: Deny,
        validate: Validate,
        when: Predicate | None,
        caps: GrantCaps,
        quorum: int,
        approvers: tuple[str, ...],
        forbid_self_approval: bool,
    ) -> Rules:
        rules = cls(
            validate=validate,
            when=when,
            caps=caps,
            quorum=quorum,
            approvers=approvers,
            forbid_self_approval=forbid_self_approval,
        )
        if deny is None or callable(deny):
            return dataclasses.replace(rules, deny=deny)
        if isinstance(deny, str | bytes) or not isinstance(deny, Sequence):
            raise ToolkitError(
                "deny= takes a predicate or a list of constraints such as ['amount > 10000']"
            )
        return dataclasses.replace(rules, deny_rules=parse_constraints(list(deny)))


@dataclass(frozen=True)
class Refuse:
    """Denied, or misfit: the model gets this error; nobody is asked."""

    message: str


@dataclass(frozen=True)
class RunUnasked:
    """The tool runs without a person: `when=` was false, or a grant approved it."""

    through: str


@dataclass(frozen=True)
class Ask:
    """A person decides; `why` is set when a predicate raised (the policy failed closed)."""

    why: str | None = None


Screened: TypeAlias = "Refuse | RunUnasked | Ask"


async def screen(rules: Rules, tool: str, args: dict[str, Any], ctx: ToolContext) -> Screened:
    """Steps 1-4 of the order, for a call nobody has decided yet."""
    ruled = denial(rules.deny_rules, args)
    if ruled is not None and not ruled.told:
        return Ask(f"{ruled.reason}: a person decides")
    try:
        denied = ruled.reason if ruled is not None else await denied_by(rules.deny, args, ctx)
    except Exception as exc:
        return Ask(f"its deny= predicate raised {_said(exc)}: a person decides")
    if denied:
        await note(ctx, tool, args, "denied", "policy", denied)
        return Refuse(f"{tool} was not called: its policy refuses it ({denied})")
    wrong = await misfit(rules.validate, args)
    if wrong is not None:
        return Refuse(
            f"{tool} was not called: its arguments do not fit ({wrong}); "
            "correct them and call it again"
        )
    if rules.when is not None:
        try:
            needed = await _call(rules.when, args, ctx)
        except Exception as exc:
            return Ask(f"its when= predicate raised {_said(exc)}: a person decides")
        if not needed:
            await note(ctx, tool, args, "approved", "policy", "when= was false: no person needed")
            return RunUnasked("policy")
    if rules.caps.grantable:
        grant = await ctx.gatekeeper.use_grant(
            GrantAsk(
                run_id=ctx.run_id,
                call_id=ctx.call_id,
                call_key=ctx.idempotency_key,
                agent=ctx.agent,
                tool=tool,
                arguments=args,
                arguments_hash=arguments_digest(args),
                conversation_id=ctx.conversation_id,
                started_by=ctx.started_by,
                caps=rules.caps,
                quorum=rules.quorum,
                approvers=rules.approvers,
                forbid_self_approval=rules.forbid_self_approval,
            )
        )
        if grant is not None:
            return RunUnasked(f"grant:{grant}")
    return Ask()


async def note(
    ctx: ToolContext,
    tool: str,
    args: dict[str, Any],
    outcome: Outcome,
    through: str,
    reason: str,
    *,
    request_id: str | None = None,
) -> None:
    """Tell the call's gatekeeper what the policy decided on it."""
    await ctx.gatekeeper.note(
        PolicyNote(
            run_id=ctx.run_id,
            call_id=ctx.call_id,
            call_key=ctx.idempotency_key,
            agent=ctx.agent,
            tool=tool,
            outcome=outcome,
            through=through,
            reason=reason,
            arguments_hash=arguments_digest(args),
            request_id=request_id,
        )
    )


@dataclass(frozen=True)
class Denied:
    """A deny rule that holds of a call's arguments, or can't be told of them."""

    reason: str
    told: bool = True
    """False: the rule can't be told of the arguments (an order between different kinds
    of value, or of an argument that is absent): the policy fails closed."""


def denial(deny_rules: Sequence[Constraint], args: dict[str, Any]) -> Denied | None:
    """The first deny rule that holds of `args`, or can't be told of them; None: none."""
    for rule in deny_rules:
        holds = rule.holds(args)
        if holds is None:
            return Denied(f"its deny rule {rule} can't be told of these arguments", told=False)
        if holds:
            return Denied(str(rule))
    return None


async def denied_by(deny: Predicate | None, args: dict[str, Any], ctx: ToolContext) -> str | None:
    """The reason a deny predicate gives for refusing the call, or None; what it raises
    goes to the caller, for whom a raise means the policy failed closed."""
    if deny is None:
        return None
    said = await _call(deny, args, ctx)
    if isinstance(said, str) and said:
        return said
    return "its deny= predicate" if said else None


async def _call(predicate: Predicate, args: dict[str, Any], ctx: ToolContext) -> object:
    if inspect.iscoroutinefunction(predicate):
        return await predicate(args, ctx)
    out = await asyncio.to_thread(predicate, args, ctx)  # the user's code: never on the loop
    if inspect.isawaitable(out):
        out = await out
    return out


async def misfit(validate: Validate, args: dict[str, Any]) -> str | None:
    """Why `args` do not fit `validate`, or None where they do (or nothing checks them)."""
    if validate is None:
        return None
    try:
        if isinstance(validate, type) and issubclass(validate, BaseModel):
            validate.model_validate(args)
        elif inspect.iscoroutinefunction(validate):
            await validate(args)
        else:  # the user's code: on a thread, never on the loop
            out = await asyncio.to_thread(validate, args)
            if inspect.isawaitable(out):
                await out
    except ValidationError as exc:
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
    except Exception as exc:
        return _said(exc)
    return None


def _said(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def arguments_digest(arguments: dict[str, Any]) -> str:
    """A hash of the arguments a decider saw, for the audit trail."""
    blob = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
