"""What relayq keeps on the broker beside Celery's messages.

`publish` and `dispatch` send a committed change's messages and mark them sent;
`peek` reads what each queue still holds, for the sweeper; `announce` tells waiting
hosts which runs may have settled; `limiter` and `circuit` (with `redis_circuit` and
`circuit_views`) share each provider's limits and outages between every process,
through the broker's Redis.
"""
