"""Benchmarks of the pull model (`python -m bench`, `make bench`).

Modules: `stats` (pure arithmetic: bounds, percentiles, windows), `keys` (one ServiceAccount
signing key per simulated runtime), `jwks_server` (their issuer keys over HTTP), `procs` (child
processes and /proc readings), `stack` (simulator, broker and KCP seed per run), `fleet` (N
simulated agents using the agent's own broker client and retry policy), `scenarios` (cold start,
outage, steady state, footprint), `results` (plain data), `report` (Markdown), `plot` (PNG).
"""
