"""The Kyma reconciler and the mapping's status.

`kyma_reconciler` (the leader's loop: deletion, label sync, the fleet's stale reports) and
`mapping_status` (every write of a mapping's status, with its conditions and Events; the token
path and the connection reports write through it too).

Inside the broker, import the defining module, never this package.
"""

__all__: list[str] = []  # import the defining modules: re-exports here would make cycles
