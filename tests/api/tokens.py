"""A token's secret part that no refusal of a malformed `RELAYQ_API_TOKENS` may echo
(tests/api/test_auth.py; tests/durable/test_inbox_security.py's API that will not start)."""

from __future__ import annotations

SECRET = "s3cret-do-not-echo"
