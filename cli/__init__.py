"""The `relayq` command: processes (worker, beat, flower, api) and host commands."""
