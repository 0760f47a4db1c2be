"""`create_client`: the in-process client on a real provider, plus `translate`."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from relayq._toolkit import Toolkit
from relayq._types import Usage
from relayq.client import ConversationStore, InProcessClient
from relayq.loop import WaitFor
from relayq.providers._config import ProviderConfig, Style
from relayq.providers._transport import ProviderModel
from relayq.providers._wire import FinishReason, ToolChoice

__all__ = ["ProviderClient", "TranslateResult", "TranslatedCall", "create_client"]


class TranslatedCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str
    """The arguments as a JSON string, as the provider sent them (or encoded from its object)."""


class TranslateResult(BaseModel):
    """One provider call's answer, in one shape whatever the provider."""

    model_config = ConfigDict(frozen=True)

    text: str
    tool_calls: list[TranslatedCall] = Field(default_factory=list)
    finish_reason: FinishReason
    """`tool_calls` whenever there is one, else `stop`, `length` or `content_filter`."""
    usage: Usage = Field(default_factory=Usage)
    model: str


class ProviderClient(InProcessClient):
    """The in-process client whose model is an HTTP provider."""

    def __init__(self, provider: ProviderModel, **options: Any) -> None:
        super().__init__(model=provider, model_name=provider.config.model, **options)
        self.provider = provider

    async def translate(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        toolkit: Toolkit | None = None,
        tool_choice: ToolChoice = None,
        system: str | None = None,
        max_tokens: int | None = None,
    ) -> TranslateResult:
        """Exactly one provider call: no loop, no tool runs, nothing kept.

        `messages` are OpenAI chat-shaped; `tools` in OpenAI function shape, or
        take them from `toolkit` (declared to the model, never executed).
        """
        declared = list(tools or []) + (toolkit.to_openai() if toolkit is not None else [])
        reply = await self.provider.complete(
            messages, tools=declared, system=system, tool_choice=tool_choice, max_tokens=max_tokens
        )
        return TranslateResult(
            text=reply.response.content,
            tool_calls=[
                TranslatedCall(
                    id=c.id,
                    name=c.name,
                    arguments=c.arguments
                    if isinstance(c.arguments, str)
                    else json.dumps(c.arguments),
                )
                for c in reply.response.tool_calls
            ],
            finish_reason=reply.finish_reason,
            usage=reply.response.usage or Usage(),
            model=reply.model,
        )

    async def aclose(self) -> None:
        await self.provider.aclose()


def create_client(
    base_url: str,
    style: Style = "openai",
    model: str = "",
    *,
    api_key: str | None = None,
    headers: dict[str, str] | None = None,
    system_prompt: str | None = None,
    max_turns: int = 10,
    retries: int = 2,
    timeout: float = 120.0,
    max_tokens: int | None = None,
    store: ConversationStore | None = None,
    wait_for: WaitFor | None = None,
) -> ProviderClient:
    """A client on an OpenAI-compatible (`style="openai"`) or Anthropic endpoint.

    The key is `api_key`, else OPENAI_API_KEY / OPENROUTER_API_KEY (openai style)
    or ANTHROPIC_API_KEY; a missing key is an error at the first call, naming
    the variables. Same methods and results as `create_in_process_client`.
    """
    config = ProviderConfig(
        style=style,
        base_url=base_url,
        model=model,
        headers=headers or {},
        retries=retries,
        timeout=timeout,
        max_tokens=max_tokens,
    )
    return ProviderClient(
        ProviderModel(config, api_key=api_key),
        wait_for=wait_for,
        max_turns=max_turns,
        system_prompt=system_prompt,
        store=store,
    )
