"""The HTTP API and the approvals inbox."""

from api.app import create_app
from api.server import serve

__all__ = ["create_app", "serve"]
