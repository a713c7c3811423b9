"""Pure rules of BYOC enrolment: a runtime without a kubeconfig Secret in KCP is trusted through
its ServiceAccount issuer once an operator approved that issuer (double opt-in).

What always holds:

- The issuer a caller presents is read from the token's *unverified* `iss`, so it is only ever a
  request to be approved, never a proof. It must be an https URL of bounded length without user
  info, query or fragment (`identity/issuer_discovery.issuer_problem`), and the token must
  otherwise look like an agent's token (our audience, an allowed ServiceAccount, not expired,
  RS256/ES256 with a key id); anything else is no identity (401) and is not recorded.
- A token is verified only against the issuer an operator approved, and only when it presents
  exactly that issuer (string equality, as OIDC compares issuers). Keys are fetched from that
  issuer's discovery document, whose `issuer` must be the same string and whose `jwks_uri` must
  be https on the issuer's own host and port: an approval of one origin never sends the broker
  to another (`identity/issuer_discovery`, used by the `jwks` proof).
- The first pending issuer stays until an operator approves or clears it: a later caller with
  another issuer (someone else who knows the runtime ID, or a rebuilt cluster) cannot replace
  it, so the value an operator checked with the cluster's owner is the value the approval
  command copies. An approval is never written by the broker.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import jwt

from control_plane_broker.errors import IdentityForbidden, IdentityNotProven
from control_plane_broker.identity import claims
from control_plane_broker.identity.issuer_discovery import issuer_problem
from control_plane_broker.registration.state import (
    ANNOTATION_ISSUER_APPROVED,
    ANNOTATION_ISSUER_PENDING,
    ANNOTATION_ISSUER_PENDING_SINCE,
)


def claimed_issuer(token: str) -> str:
    """The token's `iss` as written ("" without one), read without verifying anything: only
    compared with the approved issuer, which is verified next."""
    try:
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise IdentityNotProven("not a JWT", reason="malformed") from exc
    issuer = unverified.get("iss")
    return issuer if isinstance(issuer, str) else ""


def presented_issuer(
    token: str, *, audience: str, allowed: frozenset[tuple[str, str]], now: float
) -> str:
    """The issuer an agent's token asks to be enrolled with, read without verifying anything.

    Raises `IdentityNotProven` for anything that is not even a plausible agent token: such a
    caller is refused as before (401) and leaves no trace on the mapping."""
    try:
        header = jwt.get_unverified_header(token)
        unverified = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise IdentityNotProven("not a JWT", reason="malformed") from exc
    if header.get("alg") not in claims.ISSUER_KEY_ALGORITHMS or not header.get("kid"):
        raise IdentityNotProven("unsupported signature algorithm or no key id", reason="algorithm")
    exp = unverified.get("exp")
    if not isinstance(exp, int | float) or exp <= now:
        raise IdentityNotProven("the token has expired", reason="expired")
    aud = unverified.get("aud")
    listed = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    claims.check_audience([a for a in listed if isinstance(a, str)], audience)
    try:
        account = claims.parse_service_account(str(unverified.get("sub", "")))
    except IdentityForbidden as exc:  # unverified: nothing is proven, so no 403 either
        raise IdentityNotProven("not a ServiceAccount token", reason="not-sa") from exc
    if account not in allowed:
        raise IdentityNotProven("not an allowed ServiceAccount", reason="not-sa")
    issuer = unverified.get("iss")
    problem = issuer_problem(issuer)
    if problem is not None:
        raise IdentityNotProven(
            f"the token's issuer cannot be enrolled: {problem}", reason="issuer"
        )
    assert isinstance(issuer, str)
    return issuer


# --- the decision on one request -----------------------------------------------------------


@dataclass(frozen=True)
class Enrolment:
    """What the runtime's mapping says: the approved and the pending issuer (either may be
    missing)."""

    approved: str | None
    pending: str | None


@dataclass(frozen=True)
class VerifyWith:
    issuer: str


@dataclass(frozen=True)
class AwaitApproval:
    presented: str
    record: bool  # write `presented` as the pending issuer (there is none yet)
    enrolment: Enrolment


def decide(claimed: str, enrolment: Enrolment) -> VerifyWith | None:
    """Verify against the approved issuer when the token names exactly that one; otherwise
    nothing is proven and the caller may only ask for approval (`await_approval`)."""
    if enrolment.approved is not None and claimed == enrolment.approved:
        return VerifyWith(enrolment.approved)
    return None


def await_approval(presented: str, enrolment: Enrolment) -> AwaitApproval:
    return AwaitApproval(presented=presented, record=enrolment.pending is None, enrolment=enrolment)


def should_record(step: AwaitApproval, *, observed: str, last_written_on: str | None) -> bool:
    """Whether to write the pending issuer now. `observed` is the mapping's resourceVersion in
    the view ("" without a mapping); a write is tried at most once per observed version, so a
    stale view costs one conflicting write, and only a change someone else made (an operator
    clearing or approving, a registration) lets callers who prove nothing cause another."""
    return step.record and observed != last_written_on


def due(last: float | None, now: float, interval: float) -> bool:
    """Whether an Event for one runtime may be written now: at most one per `interval` besides
    the one that goes with a write, so callers with ever new issuers cannot flood the Events."""
    return last is None or now - last >= interval


# --- what the operator is told -------------------------------------------------------------


def shell_command(*words: str) -> str:
    """A command line an operator may paste: every word quoted for a POSIX shell, so no value
    (an issuer, a name, a placeholder) is ever read as shell syntax. Words made of safe
    characters only are left as they are, so the usual command reads as usual."""
    return " ".join(shlex.quote(word) for word in words)


def approve_command(*, namespace: str, name: str, issuer: str) -> str:
    """The one command that approves `issuer` and clears the pending record with it."""
    return shell_command(
        "kubectl",
        "-n",
        namespace,
        "annotate",
        "compassmanagermapping",
        name,
        "--overwrite",
        f"{ANNOTATION_ISSUER_APPROVED}={issuer}",
        f"{ANNOTATION_ISSUER_PENDING}-",
        f"{ANNOTATION_ISSUER_PENDING_SINCE}-",
    )


def clear_command(*, namespace: str, name: str) -> str:
    return shell_command(
        "kubectl",
        "-n",
        namespace,
        "annotate",
        "compassmanagermapping",
        name,
        f"{ANNOTATION_ISSUER_PENDING}-",
        f"{ANNOTATION_ISSUER_PENDING_SINCE}-",
    )


def event_message(step: AwaitApproval, *, namespace: str, name: str) -> str:
    # Values named in the prose are quoted too: an issuer on the mapping may have been written
    # by an operator or an older broker, and an operator may copy it into a command.
    pending = step.presented if step.record else step.enrolment.pending
    changed = (
        f" (the approved issuer is {_quoted(step.enrolment.approved)}; a changed issuer needs "
        "a new approval)"
        if step.enrolment.approved
        else ""
    )
    if pending == step.presented:
        return (
            f"ServiceAccount issuer {_quoted(step.presented)} awaits approval for this "
            f"runtime{changed}. "
            "Check with the cluster's owner that it is their cluster's issuer, then: "
            + approve_command(namespace=namespace, name=name, issuer=step.presented)
        )
    placeholder = approve_command(namespace=namespace, name=name, issuer="<issuer>")
    return (
        f"ServiceAccount issuer {_quoted(step.presented)} asks to be enrolled for this runtime, "
        f"but issuer {_quoted(pending)} is already pending{changed}. Approve the one the "
        f"cluster's owner confirms ({placeholder}), "
        f"or clear the pending one: {clear_command(namespace=namespace, name=name)}"
    )


def _quoted(value: str | None) -> str:
    return shlex.quote(value or "")


def refusal_detail(step: AwaitApproval) -> str:
    return (
        f"the ServiceAccount issuer {step.presented} is not approved for this runtime; "
        "an operator of the control plane must approve it"
    )
