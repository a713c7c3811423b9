"""Overload protection for the broker and Director, in the order a token request meets it.

`first_contact_limit` (runtimes not proven recently come in a few at a time; the HTTP layer's
`api/first_contact_middleware` applies it), `identity_budget` (failed proofs have a budget, and
one runtime ID a share of the identity checks in flight), `rate_limit` (per-runtime token
buckets), `circuit_breaker` (Director down: refuse at once), `capacity_schedule` (reservations
of Director's capacity), `reservations` (a request's reservation as a value, and the decision
that makes one), `priority_slots` (the concurrency limit, follow-up calls first),
`director_limiter` (breaker, schedule and slots around every Director call), `retry_after` (the
one place a wait becomes a `Retry-After` value) and `deferred_writes` (what no answer waits for
yields to Director's backlog). docs/overload.md tells the stages on one page.

Inside the broker, import the defining module, never this package.
"""

__all__: list[str] = []  # import the defining modules: re-exports here would make cycles
