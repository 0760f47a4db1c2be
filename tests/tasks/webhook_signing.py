"""The secret the webhook tests' endpoints sign with, and whether a delivery was signed with it
(tests/tasks/test_webhooks.py, and the real worker's in tests/durable/test_webhooks.py)."""

from __future__ import annotations

from tasks.webhooks.sender import verify_signature
from tests.webhook_receiver import Received

SECRET = "whsec-test-0123456789abcdef"


def signed(r: Received) -> bool:
    h = r.headers
    return verify_signature(SECRET, h["X-Relayq-Timestamp"], r.body, h["X-Relayq-Signature"])
