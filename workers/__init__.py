"""The Celery app (`celery -A workers worker`), its configuration, and the embedded broker."""

from workers.app import app, settings

__all__ = ["app", "settings"]
