"""The Celery app, its configuration and the process entry points."""
