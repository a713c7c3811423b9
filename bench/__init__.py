"""Benchmarks of the pull model (`python -m bench`, `make bench`): the figures of issue 10.

Modules: `stats` (pure arithmetic: bounds, percentiles, windows), `plan` (which runs, in which
order, their deadlines), `keys` (one ServiceAccount signing key per simulated runtime),
`jwks_server` (their issuer keys over HTTP), `procs` (child processes, CPU and memory from
/proc), `prometheus` (API-server request counts, broker gauges), `stack` (simulator, brokers,
API servers and their seed per run), `fleet` (N simulated agents in processes of their own,
using the agent's own broker client and retry policy), `footprint` (the real agent, idle),
`profiling` (py-spy or cProfile and their summaries), `scenarios` (cold start, outage, steady
state, per identity mode and replica count), `results` (plain data), `report` (Markdown),
`jsonout` (benchmarks.json, shape in docs/benchmarks-json.md), `plot` (PNG).
"""
