"""The Helm charts: linted, rendered for every identity mode, validated, and admitted for real.

Rendered manifests go to the real API servers into namespaces that enforce the
`restricted` Pod Security profile; a Pod is made from each pod template because
no controller runs here to make them, and any admission warning fails the test.
"""

from __future__ import annotations

from typing import Any

import pytest

from devenv.clusters import Binaries, TestCluster
from tests.charts.render import (
    CHARTS,
    HelmError,
    apply,
    by_kind,
    helm,
    pods_from_templates,
    render,
)
from tests.conftest import NamespaceFactory

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
}
BROKER_REQUIRED = {"director.url": "https://director.example.test/graphql"}
AGENT_REQUIRED = {"broker.url": "https://compass-broker.example.test"}

BROKER_MODES: dict[str, dict[str, str]] = {
    "tokenreview": {},
    "jwks": {"identity.mode": "jwks", "identity.jwksIssuerURL": "https://issuer.example.test"},
    "xfcc": {
        "identity.mode": "xfcc",
        "istio.enabled": "true",
        "istio.host": "compass-broker.example.test",
        "istio.ingressGateway.namespace": "istio-system",
        "istio.ingressGateway.podLabels.istio": "ingressgateway",
        "istio.ingressGateway.podLabels.app": "istio-ingressgateway",
    },
}
GATEWAY_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "istio-system"}},
    "podSelector": {"matchLabels": {"istio": "ingressgateway", "app": "istio-ingressgateway"}},
}
AGENT_MODES: dict[str, dict[str, str]] = {
    "serviceaccount": {},
    "mtls": {"identity.mode": "mtls", "identity.clientCertSecret": "watcher-client-cert"},
}


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


@pytest.mark.parametrize(
    ("chart", "required"), [("compass-broker", BROKER_REQUIRED), ("compass-agent", AGENT_REQUIRED)]
)
def test_helm_lint_strict(binaries: Binaries, chart: str, required: dict[str, str]) -> None:
    sets = [arg for key, value in required.items() for arg in ("--set", f"{key}={value}")]
    output = helm(binaries, "lint", "--strict", str(CHARTS / chart), *sets)
    assert "0 chart(s) failed" in output


@pytest.mark.parametrize("mode", sorted(BROKER_MODES))
def test_broker_renders_each_identity_mode(binaries: Binaries, mode: str) -> None:
    objects = render(
        binaries,
        "compass-broker",
        namespace="kcp-system",
        values=BROKER_REQUIRED | BROKER_MODES[mode],
    )
    (deployment,) = by_kind(objects, "Deployment")
    env = _env(deployment)
    assert env["BROKER_IDENTITY_MODE"] == mode
    # The forwarded client certificate is trusted in xfcc mode and only there.
    assert env["BROKER_XFCC_TRUSTED"] == str(mode == "xfcc").lower()
    assert deployment["spec"]["replicas"] == 2
    assert by_kind(objects, "PodDisruptionBudget")
    assert by_kind(objects, "CustomResourceDefinition")[0]["spec"]["names"]["kind"] == (
        "CompassManagerMapping"
    )
    assert bool(by_kind(objects, "VirtualService")) == (mode == "xfcc")
    # The header is a proof only while the gateway is the only way in.
    (policy,) = by_kind(objects, "NetworkPolicy")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    if mode == "xfcc":
        assert rule["from"] == [GATEWAY_PEER]
    else:
        assert rule["from"] == [{"namespaceSelector": {}}]


def test_broker_byoc_enrolment_is_on_by_default_and_takes_an_issuer_ca(binaries: Binaries) -> None:
    (default,) = by_kind(
        render(binaries, "compass-broker", namespace="kcp-system", values=BROKER_REQUIRED),
        "Deployment",
    )
    assert _env(default)["BROKER_BYOC_ENROLMENT"] == "true"
    assert "BROKER_ISSUER_CA_FILE" not in _env(default)
    (deployment,) = by_kind(
        render(
            binaries,
            "compass-broker",
            namespace="kcp-system",
            values=BROKER_REQUIRED
            | {"identity.byocEnrolment": "false", "identity.issuerCAConfigMap": "issuer-cas"},
        ),
        "Deployment",
    )
    env = _env(deployment)
    assert env["BROKER_BYOC_ENROLMENT"] == "false"
    pod = deployment["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "issuer-ca"]
    assert env["BROKER_ISSUER_CA_FILE"] == mount["mountPath"] + "/ca.crt"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "issuer-ca"]
    assert volume["configMap"] == {
        "name": "issuer-cas",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }


def test_xfcc_network_policy_is_the_gateway_alone_and_valid(
    binaries: Binaries, control_plane: TestCluster, namespace_factory: NamespaceFactory
) -> None:
    """Whatever `networkPolicy.ingressFrom` says: in xfcc mode it is not used, and the API
    server takes the policy as rendered (one peer: that namespace AND those pods)."""
    ns = namespace_factory(control_plane)
    objects = render(
        binaries,
        "compass-broker",
        namespace=ns,
        values=BROKER_REQUIRED
        | BROKER_MODES["xfcc"]
        | {"networkPolicy.ingressFrom[0].ipBlock.cidr": "0.0.0.0/0"},
    )
    (applied,) = apply(control_plane, by_kind(objects, "NetworkPolicy"), namespace=ns).objects
    assert applied["spec"]["ingress"] == [
        {"from": [GATEWAY_PEER], "ports": [{"port": "http", "protocol": "TCP"}]}
    ]


@pytest.mark.parametrize("mode", sorted(AGENT_MODES))
def test_agent_renders_each_identity_mode(binaries: Binaries, mode: str) -> None:
    objects = render(
        binaries,
        "compass-agent",
        namespace="kyma-system",
        values=AGENT_REQUIRED | AGENT_MODES[mode],
    )
    (deployment,) = by_kind(objects, "Deployment")
    assert _env(deployment)["AGENT_IDENTITY_MODE"] == mode
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    projected = volumes["broker-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert projected["audience"] == "compass-broker"
    assert projected["expirationSeconds"] <= 3600
    assert ("client-cert" in volumes) == (mode == "mtls")


def test_agent_rbac_names_the_one_secret(binaries: Binaries) -> None:
    objects = render(binaries, "compass-agent", namespace="kyma-system", values=AGENT_REQUIRED)
    roles = by_kind(objects, "Role") + by_kind(objects, "ClusterRole")
    rules = [rule for role in roles for rule in role["rules"]]
    assert rules
    wildcards = [r for r in rules if "*" in r["apiGroups"] + r["resources"] + r["verbs"]]
    assert wildcards == []
    secret_rules = [r for r in rules if "secrets" in r["resources"]]
    named = [r for r in secret_rules if r.get("resourceNames")]
    unnamed = [r for r in secret_rules if not r.get("resourceNames")]
    assert [r["resourceNames"] for r in named] == [["compass-agent-configuration"]]
    assert set(named[0]["verbs"]) <= {"get", "list", "watch", "update", "patch", "delete"}
    assert [r["verbs"] for r in unnamed] == [["create"]]  # create cannot be limited by name


def test_broker_may_only_get_secrets_by_name(binaries: Binaries) -> None:
    # The broker reads a runtime's kubeconfig Secret by its exact name and nothing else:
    # list or watch would let whoever holds its token read every Secret in the namespace.
    objects = render(binaries, "compass-broker", namespace="kcp-system", values=BROKER_REQUIRED)
    roles = by_kind(objects, "Role") + by_kind(objects, "ClusterRole")
    rules = [rule for role in roles for rule in role["rules"]]
    assert rules
    assert [r for r in rules if "*" in r["apiGroups"] + r["resources"] + r["verbs"]] == []
    secret_rules = [r for r in rules if "secrets" in r["resources"]]
    assert [(r["resources"], r["verbs"]) for r in secret_rules] == [(["secrets"], ["get"])]


def test_agent_may_only_annotate_the_one_compass_connection(binaries: Binaries) -> None:
    objects = render(binaries, "compass-agent", namespace="kyma-system", values=AGENT_REQUIRED)
    rules = [rule for role in by_kind(objects, "ClusterRole") for rule in role["rules"]]
    connection_rules = [r for r in rules if "compassconnections" in r["resources"]]
    assert connection_rules == [
        {
            "apiGroups": ["compass.kyma-project.io"],
            "resources": ["compassconnections"],
            "resourceNames": ["compass-connection"],
            # patch for the hand-over annotation; never update, create or delete: the
            # CompassConnection is compass-runtime-agent's
            "verbs": ["get", "list", "watch", "patch"],
        }
    ]


@pytest.mark.parametrize(
    ("chart", "values", "message"),
    [
        ("compass-broker", BROKER_REQUIRED | {"identity.mode": "magic"}, "/identity/mode"),
        ("compass-broker", BROKER_REQUIRED | {"replicaCount": "0"}, "/replicaCount"),
        ("compass-broker", {"director.url": "ftp://x"}, "/director/url"),
        ("compass-broker", BROKER_REQUIRED | {"typo": "1"}, "typo"),
        *[
            (
                "compass-broker",
                BROKER_REQUIRED | BROKER_MODES["xfcc"] | {key: value},
                f"identity.mode=xfcc needs {needed}",
            )
            for key, value, needed in [
                ("istio.ingressGateway.namespace", "", "istio.ingressGateway.namespace"),
                ("istio.ingressGateway.podLabels", "null", "istio.ingressGateway.podLabels"),
                ("networkPolicy.enabled", "false", "networkPolicy.enabled=true"),
            ]
        ],
        (
            "compass-broker",
            BROKER_REQUIRED | {"istio.ingressGateway.namespace": "Not_A_Namespace"},
            "/istio/ingressGateway/namespace",
        ),
        *[
            (
                "compass-broker",
                BROKER_REQUIRED | {"extraEnv[0].name": name, "extraEnv[0].value": value},
                f"extraEnv cannot set {name}",
            )
            for name, value in [("BROKER_XFCC_TRUSTED", "yes"), ("BROKER_IDENTITY_MODE", "xfcc")]
        ],
        (
            "compass-broker",
            BROKER_REQUIRED | {"identity.xfccDenyListConfigMap": "revoked"},
            "xfccDenyListConfigMap is for identity.mode=xfcc only",
        ),
        (
            "compass-agent",
            AGENT_REQUIRED | {"identity.tokenExpirationSeconds": "60"},
            "tokenExpirationSeconds",
        ),
        ("compass-agent", AGENT_REQUIRED | {"moduleSignals[0]": "always"}, "/moduleSignals/0"),
        ("compass-agent", {"broker.urlTemplate": "http://{kcp_domain}"}, "/broker/urlTemplate"),
        (
            "compass-agent",
            AGENT_REQUIRED | {"identity.mode": "mtls"},
            "clientCertSecret is required",
        ),
    ],
)
def test_bad_values_fail_with_a_clear_message(
    binaries: Binaries, chart: str, values: dict[str, str], message: str
) -> None:
    namespace = "kyma-system" if chart == "compass-agent" else "default"
    with pytest.raises(HelmError, match=message.replace("[", r"\[")):
        render(binaries, chart, namespace=namespace, values=values)


def _admit(cluster: TestCluster, namespace: str, objects: list[dict[str, Any]]) -> None:
    applied = apply(cluster, objects, namespace=namespace)
    pods = apply(cluster, pods_from_templates(objects), namespace=namespace)
    assert applied.warnings == []
    assert pods.warnings == []
    assert len(pods.objects) == len(by_kind(objects, "Deployment")) >= 1


def test_broker_chart_is_admitted_under_restricted_pod_security(
    binaries: Binaries, control_plane: TestCluster, namespace_factory: NamespaceFactory
) -> None:
    ns = namespace_factory(control_plane, labels=RESTRICTED)
    objects = render(
        binaries, "compass-broker", namespace=ns, values=BROKER_REQUIRED | {"kcpNamespace": ns}
    )
    _admit(control_plane, ns, objects)


def test_agent_chart_is_admitted_under_restricted_pod_security(
    binaries: Binaries, runtime_a: TestCluster, namespace_factory: NamespaceFactory
) -> None:
    ns = namespace_factory(runtime_a, labels=RESTRICTED)
    objects = render(
        binaries,
        "compass-agent",
        namespace=ns,
        values=AGENT_REQUIRED | {"testing.anyNamespace": "true"},
    )
    _admit(runtime_a, ns, objects)


def test_restricted_namespace_really_refuses_a_privileged_pod(
    runtime_a: TestCluster, namespace_factory: NamespaceFactory
) -> None:
    """Guards the two tests above: admission in these namespaces does enforce the profile."""
    ns = namespace_factory(runtime_a, labels=RESTRICTED)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]
        },
    }
    with pytest.raises(AssertionError, match="violates PodSecurity"):
        apply(runtime_a, [pod], namespace=ns)
