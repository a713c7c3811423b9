"""BYOC enrolment: the pure rules (which issuer may be recorded, the decision on one request,
what the mapping and the operator get) and key discovery of an approved issuer through
`JwksVerifier.verify_with_issuer`, against an issuer played by a MockTransport (an OIDC issuer
is plain HTTPS, not Kubernetes)."""

from __future__ import annotations

import json
import shlex
import time
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from control_plane_broker.enrolment import enrolment_rules as rules
from control_plane_broker.enrolment.enrolment_rules import AwaitApproval, Enrolment, VerifyWith
from control_plane_broker.errors import (
    ControlPlaneUnavailable,
    IdentityForbidden,
    IdentityNotProven,
)
from control_plane_broker.identity.issuer_discovery import issuer_problem
from control_plane_broker.identity.jwks import JwksVerifier
from control_plane_broker.kube.runtime_access import RuntimeAccess
from control_plane_broker.kyma import KymaView
from control_plane_broker.registration import state
from kubeapi import ClusterAccess, KubeClient

ALLOWED = frozenset({("kyma-system", "compass-agent")})
AGENT = "system:serviceaccount:kyma-system:compass-agent"
ISSUER = "https://oidc.byoc.test/id/abc"
NOW = 1_800_000_000.0


def _token(key: Any = None, *, kid: str = "k1", alg: str = "ES256", **changes: Any) -> str:
    key = key or ec.generate_private_key(ec.SECP256R1())
    payload = {
        "iss": ISSUER,
        "aud": ["compass-broker"],
        # A day: parametrized tokens are made when the tests are collected, and a full run
        # reaches these a quarter of an hour later.
        "exp": int(time.time()) + 86400,
        "sub": AGENT,
    } | changes
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid} if kid else {})


# --- which issuer may be recorded --------------------------------------------------------------


@pytest.mark.parametrize(
    "issuer",
    [
        ISSUER,
        "https://oidc.eks.eu-west-1.amazonaws.com/id/0123456789ABCDEF",
        "https://issuer.test:8443/",
        "https://127.0.0.1:6443",
    ],
)
def test_https_issuers_are_acceptable(issuer: str) -> None:
    assert issuer_problem(issuer) is None


@pytest.mark.parametrize(
    ("issuer", "problem"),
    [
        (None, "no issuer"),
        ("", "no issuer"),
        (42, "no issuer"),
        ("http://issuer.test", "not https"),
        ("file:///etc/passwd", "not https"),
        ("https://user:pw@issuer.test", "user info"),
        ("https://@issuer.test", "user info"),
        ("https:///path-only", "no host"),
        ("https://issuer.test/?x=1", "query or fragment"),
        ("https://issuer.test/#frag", "query or fragment"),
        ("https://issuer.test/a b", "printable"),
        ("https://issuer.test/\u00e4", "printable"),
        ("https://issuer.test/\x00", "printable"),
        ("https://issuer.test:0", "port 0"),
        ("https://issuer.test:99999", "not a URL"),
        ("https://" + "a" * 600 + ".test", "longer than"),
        # Shell syntax, as an unauthenticated first contact presented it (issue 28, item 5):
        ("https://issuer.example/$(touch${IFS}/tmp/x)`id`;x", "characters other than"),
        ("https://issuer.example/`id`", "characters other than"),
        ("https://issuer.example/a;b", "characters other than"),
        ("https://issuer.example/a|b", "characters other than"),
        ("https://issuer.example/a&b", "characters other than"),
        ("https://issuer.example/a'b", "characters other than"),
        ('https://issuer.example/a"b', "characters other than"),
        ("https://issuer.example/a>b", "characters other than"),
        ("https://issuer.example/a(b)", "characters other than"),
        ("https://issuer.example/a*", "characters other than"),
        ("https://issuer.example/a\\b", "characters other than"),
        ("https://issuer.example/{a}", "characters other than"),
        ("https://[::1]:6443", "characters other than"),
    ],
)
def test_anything_else_is_refused_with_a_reason(issuer: object, problem: str) -> None:
    assert problem in (issuer_problem(issuer) or "")


def test_a_plausible_agent_token_presents_its_issuer() -> None:
    token = _token()
    assert (
        rules.presented_issuer(token, audience="compass-broker", allowed=ALLOWED, now=time.time())
        == ISSUER
    )


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("not-a-jwt", "malformed"),
        (
            jwt.encode({"iss": ISSUER}, "secret-key-of-32-bytes-or-more!!", algorithm="HS256"),
            "algorithm",
        ),
        (_token(kid=""), "algorithm"),
        (_token(exp=int(time.time()) - 10), "expired"),
        (_token(exp="soon"), "expired"),
        (_token(aud=["someone-else"]), "audience"),
        (_token(aud=[{"compass-broker": 1}, 7]), "audience"),
        (_token(aud=7), "audience"),
        (_token(sub="alice"), "not-sa"),
        (_token(sub="system:serviceaccount:kyma-system"), "not-sa"),
        (_token(sub="system:serviceaccount:default:default"), "not-sa"),
        (_token(iss="http://oidc.byoc.test"), "issuer"),
        (_token(iss=""), "issuer"),
        (_token(iss="https://user@oidc.byoc.test"), "issuer"),
    ],
)
def test_an_implausible_token_is_no_identity_and_presents_nothing(token: str, reason: str) -> None:
    with pytest.raises(IdentityNotProven) as caught:
        rules.presented_issuer(token, audience="compass-broker", allowed=ALLOWED, now=time.time())
    assert caught.value.reason == reason


# --- the decision on one request ---------------------------------------------------------------


def test_only_the_approved_issuer_is_verified() -> None:
    assert rules.decide(ISSUER, Enrolment(approved=ISSUER, pending=None)) == VerifyWith(ISSUER)
    # A trailing slash is another issuer: OIDC compares issuers as strings.
    assert rules.decide(ISSUER + "/", Enrolment(ISSUER, None)) is None
    assert rules.decide(ISSUER, Enrolment(approved=None, pending=ISSUER)) is None
    assert rules.decide("", Enrolment(approved=None, pending=None)) is None


def test_the_claimed_issuer_is_read_without_verifying_anything() -> None:
    assert rules.claimed_issuer(_token(iss="https://whatever.test")) == "https://whatever.test"
    assert rules.claimed_issuer(_token(iss="")) == ""
    with pytest.raises(IdentityNotProven):
        rules.claimed_issuer("garbage")


def test_the_first_pending_issuer_is_kept_until_an_operator_acts() -> None:
    nothing = Enrolment(approved=None, pending=None)
    assert rules.await_approval(ISSUER, nothing) == AwaitApproval(
        ISSUER, record=True, enrolment=nothing
    )
    # The same issuer again writes nothing; another one does not replace it.
    mine = Enrolment(approved=None, pending=ISSUER)
    assert rules.await_approval(ISSUER, mine).record is False
    assert rules.await_approval("https://attacker.test", mine).record is False


def test_a_changed_issuer_after_approval_needs_a_new_approval() -> None:
    approved = Enrolment(approved=ISSUER, pending=None)
    assert rules.decide("https://rebuilt.byoc.test", approved) is None
    step = rules.await_approval("https://rebuilt.byoc.test", approved)
    assert step == AwaitApproval("https://rebuilt.byoc.test", record=True, enrolment=approved)
    message = rules.event_message(step, namespace="kcp-system", name="rt-1")
    assert f"the approved issuer is {ISSUER}" in message
    assert "issuer-approved=https://rebuilt.byoc.test " in message


def test_a_pending_write_is_tried_once_per_observed_mapping_version() -> None:
    first = rules.await_approval(ISSUER, Enrolment(None, None))
    assert rules.should_record(first, observed="", last_written_on=None)
    # The view has not caught up with our own create (or it conflicted): no second write.
    assert not rules.should_record(first, observed="", last_written_on="")
    # Someone else changed the mapping (an operator cleared the pending issuer): one more.
    assert rules.should_record(first, observed="12", last_written_on="")
    pending = rules.await_approval(ISSUER, Enrolment(None, pending=ISSUER))
    assert not rules.should_record(pending, observed="13", last_written_on=None)


def test_events_beyond_writes_are_paced_per_runtime() -> None:
    assert rules.due(None, 100.0, 60.0)
    assert not rules.due(100.0, 159.9, 60.0)
    assert rules.due(100.0, 160.0, 60.0)


def test_the_event_gives_the_one_command_that_approves_and_clears_pending() -> None:
    step = rules.await_approval(ISSUER, Enrolment(None, None))
    message = rules.event_message(step, namespace="kcp-system", name="rt-1")
    assert message.endswith(
        "kubectl -n kcp-system annotate compassmanagermapping rt-1 --overwrite "
        f"compass-broker.kyma-project.io/issuer-approved={ISSUER} "
        "compass-broker.kyma-project.io/issuer-pending- "
        "compass-broker.kyma-project.io/issuer-pending-since-"
    )


@pytest.mark.parametrize(
    ("namespace", "name", "issuer"),
    [
        ("kcp-system", "rt-1", ISSUER),
        ("kcp system", "rt-1;id", "https://issuer.example/$(touch${IFS}x)`id`;x"),
        ("$(id)", "a'b", "https://x/'\"'; rm -rf ~"),
        ("-n", "--overwrite", "<issuer>"),
    ],
)
def test_every_printed_command_is_the_intended_argv_whatever_the_values(
    namespace: str, name: str, issuer: str
) -> None:
    # Whatever reached a value (an issuer recorded by an older broker, a name), a shell reads
    # back exactly the words meant: no substitution, no second command, no lost quote.
    approve = rules.approve_command(namespace=namespace, name=name, issuer=issuer)
    assert shlex.split(approve) == [
        "kubectl",
        "-n",
        namespace,
        "annotate",
        "compassmanagermapping",
        name,
        "--overwrite",
        f"compass-broker.kyma-project.io/issuer-approved={issuer}",
        "compass-broker.kyma-project.io/issuer-pending-",
        "compass-broker.kyma-project.io/issuer-pending-since-",
    ]
    clear = rules.clear_command(namespace=namespace, name=name)
    assert shlex.split(clear)[2] == namespace
    assert shlex.split(clear)[5] == name


def test_an_unsafe_issuer_already_on_the_mapping_is_quoted_in_the_event() -> None:
    # Recorded before issuers were restricted: named in the prose only quoted, never approved.
    hostile = "https://x/$(id)`id`"
    step = rules.await_approval(ISSUER, Enrolment(approved=hostile, pending=hostile))
    message = rules.event_message(step, namespace="kcp-system", name="rt-1")
    assert hostile not in message.replace(shlex.quote(hostile), "")


def test_another_issuer_while_one_is_pending_names_both_and_approves_neither() -> None:
    step = rules.await_approval("https://attacker.test", Enrolment(None, pending=ISSUER))
    message = rules.event_message(step, namespace="kcp-system", name="rt-1")
    assert "https://attacker.test asks" in message
    assert f"issuer {ISSUER} is already pending" in message
    assert "issuer-approved=https://attacker.test" not in message
    assert f"issuer-approved={ISSUER}" not in message
    assert "issuer-approved=<issuer>" in message


# --- the mapping -------------------------------------------------------------------------------

KYMA = KymaView(
    name="rt-1",
    namespace="kcp-system",
    uid="u1",
    resource_version="1",
    labels={"kyma-project.io/runtime-id": "RT-1", "kyma-project.io/global-account-id": "ga"},
)


def test_a_mapping_created_by_enrolment_has_no_claim_and_is_claimed_like_any_other() -> None:
    obj = state.new_pending_mapping(KYMA, namespace="kcp-system", issuer=ISSUER, now=NOW)
    obj["metadata"]["resourceVersion"] = "7"
    mapping = state.Mapping.from_object(obj)
    assert (mapping.issuer_pending, mapping.issuer_approved) == (ISSUER, None)
    assert (mapping.claim_holder, mapping.compass_id) == (None, None)
    assert obj["metadata"]["annotations"][state.ANNOTATION_ISSUER_PENDING_SINCE] == (
        state.to_rfc3339(NOW)
    )
    assert obj["metadata"]["labels"]["kyma-project.io/runtime-id"] == "RT-1"
    assert state.decide(mapping, me="r1", now=NOW) == state.TakeClaim(resource_version="7")
    # The claim keeps the enrolment annotations: registration never loses an approval.
    claimed = state.claimed(mapping, me="r1", now=NOW, claim_seconds=60)
    assert claimed["metadata"]["annotations"][state.ANNOTATION_ISSUER_PENDING] == ISSUER


def test_recording_a_pending_issuer_keeps_approval_claim_and_resource_version() -> None:
    obj = state.new_mapping(KYMA, namespace="kcp-system", me="r1", now=NOW, claim_seconds=60)
    obj["metadata"]["resourceVersion"] = "9"
    obj["metadata"]["annotations"][state.ANNOTATION_ISSUER_APPROVED] = "https://old.test"
    mapping = state.Mapping.from_object(obj)
    written = state.with_pending_issuer(mapping, issuer=ISSUER, now=NOW)
    again = state.Mapping.from_object(written)
    assert (again.issuer_approved, again.issuer_pending) == ("https://old.test", ISSUER)
    assert again.claim_holder == "r1"
    assert again.resource_version == "9"  # the write is conditional on what was observed
    assert mapping.issuer_pending is None  # the observed object is not changed


# --- keys of an approved issuer ----------------------------------------------------------------


def _jwk(key: Any, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    return jwk | {"kid": kid, "alg": "ES256", "use": "sig"}


class Issuer:
    """An OIDC issuer on https://oidc.byoc.test: discovery and key set, requests counted."""

    def __init__(self) -> None:
        self.discovery: dict[str, Any] = {"issuer": ISSUER, "jwks_uri": ISSUER + "/keys"}
        self.jwks: dict[str, Any] = {"keys": []}
        self.requests: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(str(request.url))
        if str(request.url) == ISSUER + "/.well-known/openid-configuration":
            return httpx.Response(200, json=self.discovery)
        if request.url.path == "/moved":
            return httpx.Response(302, headers={"Location": ISSUER + "/keys"})
        if str(request.url) == self.discovery.get("jwks_uri"):
            return httpx.Response(200, json=self.jwks)
        return httpx.Response(404)


def _verifier(issuer: Issuer, clock: Any) -> tuple[JwksVerifier, KubeClient, httpx.AsyncClient]:
    # No kubeconfig is ever read for an enrolled issuer: any KCP request fails the test.
    def no_kcp(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"unexpected request to {request.url}")

    kcp = KubeClient(
        ClusterAccess(server="https://kcp.test"),
        user_agent="t",
        transport=httpx.MockTransport(no_kcp),
    )
    access = RuntimeAccess(
        kcp,
        namespace="kcp-system",
        secret_name_pattern="kubeconfig-{runtime_id}",
        ttl_seconds=60,
        clock=clock,
    )
    http = httpx.AsyncClient(transport=httpx.MockTransport(issuer.handler))
    verifier = JwksVerifier(
        access,
        audience="compass-broker",
        allowed=ALLOWED,
        issuer_url="",
        http=http,
        clock=clock,
        refetch_seconds=10,
    )
    return verifier, kcp, http


async def test_keys_of_an_approved_issuer_come_from_its_discovery_and_follow_rotation() -> None:
    issuer = Issuer()
    old, new = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    issuer.jwks = {"keys": [_jwk(old, "old")]}
    now = [1000.0]
    verifier, kcp, http = _verifier(issuer, lambda: now[0])
    ident = await verifier.verify_with_issuer(
        runtime_id="rt-1", token=_token(old, kid="old"), issuer=ISSUER
    )
    assert (ident.runtime_id, ident.subject) == ("rt-1", AGENT)
    assert issuer.requests == [ISSUER + "/.well-known/openid-configuration", ISSUER + "/keys"]
    # The issuer rotates: a new key, the old one gone. Tokens with the new key pass once the
    # refetch period allows asking again.
    issuer.jwks = {"keys": [_jwk(new, "new")]}
    now[0] += 11
    await verifier.verify_with_issuer(
        runtime_id="rt-1", token=_token(new, kid="new"), issuer=ISSUER
    )
    assert len(issuer.requests) == 4
    # A token of another issuer, even signed by the approved issuer's key, is not accepted.
    with pytest.raises(IdentityForbidden):
        await verifier.verify_with_issuer(
            runtime_id="rt-1", token=_token(new, kid="new", iss="https://other.test"), issuer=ISSUER
        )
    await http.aclose()
    await kcp.aclose()


async def test_a_verdict_is_bound_to_the_issuer_it_was_given_under() -> None:
    issuer = Issuer()
    key = ec.generate_private_key(ec.SECP256R1())
    issuer.jwks = {"keys": [_jwk(key, "k1")]}
    verifier, kcp, http = _verifier(issuer, lambda: 1000.0)
    token = _token(key)
    await verifier.verify_with_issuer(runtime_id="rt-1", token=token, issuer=ISSUER)
    # Had the approval moved to another issuer, the cached verdict must not answer for it.
    with pytest.raises(ControlPlaneUnavailable):
        await verifier.verify_with_issuer(
            runtime_id="rt-1", token=token, issuer="https://elsewhere.test"
        )
    await http.aclose()
    await kcp.aclose()


@pytest.mark.parametrize(
    "discovery",
    [
        {"issuer": "https://oidc.byoc.test/id/other", "jwks_uri": ISSUER + "/keys"},
        {"issuer": ISSUER, "jwks_uri": "https://metadata.internal/keys"},
        {"issuer": ISSUER, "jwks_uri": "https://oidc.byoc.test:8443/keys"},
        {"issuer": ISSUER, "jwks_uri": "http://oidc.byoc.test/keys"},
        {"issuer": ISSUER},
        {"issuer": ISSUER, "jwks_uri": "https://oidc.byoc.test/moved"},  # redirects not followed
    ],
)
async def test_a_discovery_document_that_leads_elsewhere_is_refused_before_any_key_fetch(
    discovery: dict[str, Any],
) -> None:
    issuer = Issuer()
    issuer.discovery = discovery
    key = ec.generate_private_key(ec.SECP256R1())
    issuer.jwks = {"keys": [_jwk(key, "k1")]}
    verifier, kcp, http = _verifier(issuer, lambda: 1000.0)
    with pytest.raises(ControlPlaneUnavailable):
        await verifier.verify_with_issuer(runtime_id="rt-1", token=_token(key), issuer=ISSUER)
    assert ISSUER + "/keys" not in issuer.requests
    assert all(url.startswith("https://oidc.byoc.test/") for url in issuer.requests)
    await http.aclose()
    await kcp.aclose()


async def test_an_unknown_key_of_the_approved_issuer_is_no_identity_of_this_runtime() -> None:
    issuer = Issuer()
    issuer.jwks = {"keys": [_jwk(ec.generate_private_key(ec.SECP256R1()), "k1")]}
    verifier, kcp, http = _verifier(issuer, lambda: 1000.0)
    with pytest.raises(IdentityForbidden):
        await verifier.verify_with_issuer(
            runtime_id="rt-1", token=_token(kid="somebody-elses"), issuer=ISSUER
        )
    with pytest.raises(IdentityNotProven):
        await verifier.verify_with_issuer(
            runtime_id="rt-1", token=_token(kid="k1", aud=["x"]), issuer=ISSUER
        )
    await http.aclose()
    await kcp.aclose()


class _Endless(httpx.AsyncByteStream):
    """A body of `total` bytes, served in 64 KiB chunks; counts what was read of it."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.served = 0

    async def __aiter__(self) -> Any:
        chunk = b" " * 65536
        while self.served < self.total:
            self.served += len(chunk)
            yield chunk


@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("which", ["discovery", "keys"])
async def test_an_issuers_oversized_answer_is_refused_unread(which: str, declared: bool) -> None:
    # A 64 MiB discovery document took the broker over its memory limit (issue 28, item 6).
    body = _Endless(64 << 20)
    issuer = Issuer()
    key = ec.generate_private_key(ec.SECP256R1())
    issuer.jwks = {"keys": [_jwk(key, "k1")]}
    plain = issuer.handler

    def handler(request: httpx.Request) -> httpx.Response:
        is_keys = str(request.url) == ISSUER + "/keys"
        if (which == "keys") == is_keys:
            plain(request)
            headers = {"Content-Length": str(body.total)} if declared else {}
            return httpx.Response(200, headers=headers, stream=body)
        return plain(request)

    issuer.handler = handler  # type: ignore[method-assign]
    verifier, kcp, http = _verifier(issuer, lambda: 1000.0)
    with pytest.raises(ControlPlaneUnavailable, match="larger than"):
        await verifier.verify_with_issuer(runtime_id="rt-1", token=_token(key), issuer=ISSUER)
    assert body.served <= 512 << 10
    await http.aclose()
    await kcp.aclose()
