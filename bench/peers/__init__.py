"""relayq beside its peers, Pydantic AI and LangGraph, on the same local model server.

    python -m bench.peers                              # every system, both scenarios
    python -m bench.peers --systems relayq,langgraph --repeat 3

See `bench/peers/__main__.py` for what is measured. Modules: `run` (the scenarios,
interleaved), `sample` (what a run of a system comes to), `drive_*` (one system
each, the way its users run it) and `tables` (the markdown).
"""
