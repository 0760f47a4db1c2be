"""Durable state: runs, messages, requests, the tool-call ledger and the outbox (SQLModel)."""
