"""Real model providers: OpenAI-compatible chat completions and Anthropic messages.

client = create_client("https://api.openai.com/v1", "openai", "gpt-4o-mini")
result = await client.run("What is 2+2?", toolkit)
one = await client.translate([{"role": "user", "content": "hi"}])
"""

from relayq.providers._client import ProviderClient, TranslatedCall, TranslateResult, create_client
from relayq.providers._config import ModelPrice, ProviderConfig, Style
from relayq.providers._transport import RETRYABLE_STATUS, ProviderModel, redact
from relayq.providers._wire import FinishReason, ToolChoice

__all__ = [
    # configuration
    "ModelPrice",
    "ProviderConfig",
    "Style",
    # clients and models
    "ProviderClient",
    "ProviderModel",
    "create_client",
    # translate
    "FinishReason",
    "ToolChoice",
    "TranslateResult",
    "TranslatedCall",
    # errors
    "RETRYABLE_STATUS",
    "redact",
]
