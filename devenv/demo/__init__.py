"""The local demo (`make demo`, `python -m devenv.demo`): the whole system as real processes.

A control-plane API server (KCP) and two runtime API servers (A managed, B bring-your-own), the
Compass simulator, the broker, one agent and one simulated compass-runtime-agent per runtime.
The story: the module is enabled in A and A connects; Compass goes down; the module is enabled
in B and B's agent backs off; Compass comes back and B connects; A's Kyma is deleted and A is
unregistered from Compass. It ends with a summary table.

Modules: `cli` (arguments, signals, exit codes), `story` (one method per step), `world` (the
Kubernetes objects KCP, KLM and users create), `observe` (simulator admin API, metrics, logs),
`processes` (children with log files), `console` (step lines, waits with timeouts, the table).
"""
