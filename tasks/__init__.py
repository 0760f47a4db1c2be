"""Celery tasks that drive durable runs, and the host-side client."""
