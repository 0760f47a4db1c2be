"""One turn of a run, as a Celery task: `task` claims it and drives `relayq.loop.take_turn`;
`journal` keeps its progress in the store; `hooks` tells the hooks of it; `budgets` gates
it; `waits` sends it back to its queue; `failed` and `failures` end a run that failed in
it; `answers` is the answer task, which queues the next turn.
"""
