"""The in-process client: the agent loop in this process, around `take_turn`.

client = create_in_process_client(generate=my_model)
halted = await client.run("do all three", toolkit)
if halted.status == "pending":
    answer = relay_answer(halted.pending.id, results)
    done = await client.run_with_answer(toolkit, halted.messages, halted.pending, answer)
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

from relayq import transcript as tx
from relayq._errors import ResumeError
from relayq._toolkit import Toolkit
from relayq._types import Answer, Request, RunResult, new_id
from relayq.loop import Cancel, RunFacts, Turn, WaitFor, apply_answer, take_turn
from relayq.model import (
    Generate,
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    Model,
    as_model,
)
from relayq.policies import Gatekeeper

__all__ = [
    "ConversationStore",
    "InMemoryConversationStore",
    "InProcessClient",
    "InProcessRequest",
    "InProcessResponse",
    "InProcessToolCall",
    "create_in_process_client",
    "result_of",
]


class ConversationStore(Protocol):
    """Keeps a conversation's transcript under its id, for `ask` and `ask_with_answer`."""

    async def load(self, conversation_id: str) -> list[dict[str, Any]]:
        """The transcript, or an empty list for a new conversation."""
        ...

    async def save(self, conversation_id: str, messages: list[dict[str, Any]]) -> None: ...


class InMemoryConversationStore:
    """Transcripts in a dict; each load and save copies, so callers cannot alias them."""

    def __init__(self) -> None:
        self._conversations: dict[str, list[dict[str, Any]]] = {}

    async def load(self, conversation_id: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self._conversations.get(conversation_id, []))

    async def save(self, conversation_id: str, messages: list[dict[str, Any]]) -> None:
        self._conversations[conversation_id] = copy.deepcopy(messages)


def result_of(turn: Turn, run_id: str) -> RunResult:
    """The RunResult a finished or halted turn stands for; all derived from the transcript."""
    if turn.status == "next":
        raise ValueError("a turn that goes on has no result yet")
    return RunResult(
        status=turn.status,
        text=turn.text if turn.status == "done" else "",
        tool_calls=tx.records_of(turn.messages),
        messages=turn.messages,
        pending=turn.pending,
        turns=tx.turns_taken(turn.messages),
        usage=tx.usage_of(turn.messages),
        run_id=run_id,
    )


class InProcessClient:
    """Runs the agent loop in this process. Build it with `create_in_process_client`."""

    def __init__(
        self,
        *,
        model: Model,
        wait_for: WaitFor | None = None,
        max_turns: int = 10,
        system_prompt: str | None = None,
        store: ConversationStore | None = None,
        model_name: str = "in-process",
        gatekeeper: Gatekeeper | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self._model = model
        self._wait_for = wait_for
        self._max_turns = max_turns
        self._system_prompt = system_prompt
        self._model_name = model_name
        self._facts = RunFacts(gatekeeper=gatekeeper or Gatekeeper())
        self.store: ConversationStore = store if store is not None else InMemoryConversationStore()

    async def run(
        self,
        prompt: str,
        toolkit: Toolkit,
        *,
        history: list[dict[str, Any]] | None = None,
        cancel: Cancel | None = None,
    ) -> RunResult:
        """Run `prompt` to its end, or until it halts on a request for the host."""
        messages = list(history or [])
        tx.check(messages)
        waiting = tx.open_requests(messages)
        if waiting:
            raise ResumeError(
                f"the history waits on request {waiting[0].id}; answer it with "
                "run_with_answer before starting a new prompt",
                waiting[0].id,
            )
        run_id = new_id("run")
        messages.append(tx.user_message(prompt, run_id))
        return await self._drive(messages, toolkit, run_id, cancel)

    async def run_with_answer(
        self,
        toolkit: Toolkit,
        history: list[dict[str, Any]],
        pending: Request | dict[str, Any],
        answer: Answer | dict[str, Any],
        *,
        cancel: Cancel | None = None,
    ) -> RunResult:
        """Resume a halted run from its transcript: no new user turn is added."""
        request = Request.model_validate(pending)
        messages = apply_answer(list(history), request, Answer.model_validate(answer))
        run_id = tx.run_id_of(messages) or new_id("run")
        return await self._drive(messages, toolkit, run_id, cancel)

    async def ask(
        self, prompt: str, toolkit: Toolkit, *, id: str, cancel: Cancel | None = None
    ) -> RunResult:
        """`run`, continuing the conversation kept in the store under `id`."""
        history = await self.store.load(id)
        result = await self.run(prompt, toolkit, history=history, cancel=cancel)
        await self.store.save(id, result.messages)
        return result

    async def ask_with_answer(
        self,
        toolkit: Toolkit,
        id: str,
        pending: Request | dict[str, Any],
        answer: Answer | dict[str, Any],
        *,
        cancel: Cancel | None = None,
    ) -> RunResult:
        """`run_with_answer` on the conversation kept in the store under `id`."""
        history = await self.store.load(id)
        result = await self.run_with_answer(toolkit, history, pending, answer, cancel=cancel)
        await self.store.save(id, result.messages)
        return result

    async def _drive(
        self,
        messages: list[dict[str, Any]],
        toolkit: Toolkit,
        run_id: str,
        cancel: Cancel | None,
    ) -> RunResult:
        while True:
            turn = await take_turn(
                messages,
                toolkit,
                self._model,
                run_id=run_id,
                max_turns=self._max_turns,
                system_prompt=self._system_prompt,
                model_name=self._model_name,
                wait_for=self._wait_for,
                cancel=cancel,
                facts=self._facts,
            )
            if turn.status != "next":
                return result_of(turn, run_id)
            messages = turn.messages


def create_in_process_client(
    *,
    generate: Generate,
    wait_for: WaitFor | None = None,
    max_turns: int = 10,
    system_prompt: str | None = None,
    store: ConversationStore | None = None,
    gatekeeper: Gatekeeper | None = None,
) -> InProcessClient:
    """A client whose model is your `generate(InProcessRequest) -> InProcessResponse`.

    `generate` and `wait_for` may be sync or async. Without `wait_for` a run that
    calls a relay tool (or a tool returning `pending(...)`) halts with
    `status == "pending"`; with it, each request is answered inline. `gatekeeper`
    keeps what approval policies decide without a person, and holds standing grants
    (`relayq.policies.Gatekeeper`; by default none, and nothing kept).
    """
    return InProcessClient(
        model=as_model(generate),
        wait_for=wait_for,
        max_turns=max_turns,
        system_prompt=system_prompt,
        store=store,
        gatekeeper=gatekeeper,
    )
