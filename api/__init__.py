"""The HTTP API and the approvals inbox."""

from api._auth import Tokens
from api.app import create_app
from api.server import serve

__all__ = ["Tokens", "create_app", "serve"]
