"""The worker's side of durable runs: what a worker process holds, and the turn it runs.

`runtime` is the process's container (its store, agents, hooks, dispatch); `turn` the
turn's task and its parts, and the answer task; `maintenance` the maintenance queue's
tasks; `heartbeat`, `loopwatch`, `tool_threads`, `alone`, `memory` and `transcripts`
what keeps a worker well while it runs them. The client (`tasks.client`) builds on it
only to run turns in its own process (`DurableClient(eager=True)`).
"""
