"""The client's side of durable runs: `DurableClient` and what it holds.

A client starts runs, waits for them and answers their requests; workers in other
processes take the turns (`tasks.runner`). `client` is the verbs; `starting`, `settling`
and `answering` the work of each kind of verb; `waiting` the one waiter per loop that
hears the workers' announcements; `eager` the runtime that takes the turns here
instead (`DurableClient(eager=True)`).
"""
