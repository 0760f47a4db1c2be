"""The HTTP API and the approvals inbox."""
