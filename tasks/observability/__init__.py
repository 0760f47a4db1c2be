"""What the runs' work looks like from outside: `metrics` (this process's counters, a
hook), `gauges` (the store and the broker as they stand, read when scraped) and
`tracing` (OpenTelemetry spans of every run, a hook)."""
