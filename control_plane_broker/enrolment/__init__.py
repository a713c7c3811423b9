"""BYOC enrolment: a runtime without a kubeconfig Secret in KCP is trusted through its
ServiceAccount issuer once an operator approved that issuer (double opt-in).

`enrolment_rules` (pure) decides on one request and says what the mapping and the operator get;
`enrolment_service` is the use case: it wraps the mode's identity proof, records a pending
issuer on the mapping and tells the operator by an Event. The proof of a token against the
approved issuer's keys stays in `identity` (`jwks`, `issuer_discovery`). Inside the broker,
import these modules, not this package.
"""
