"""devenv.node's pure parts: the toolchain builds the node from kube-apiserver's module, the
small images are valid OCI archives, the host snapshot compares and survives a crash (JSON), and
the generated configurations carry the host fixes docs/real-node.md names."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from devenv.node import host, images, node
from tests.conftest import REPO_ROOT

TOOLCHAIN = REPO_ROOT / "devenv" / "toolchain"
NODE_BINARIES = ("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy")


def test_the_node_binaries_are_mains_of_the_kube_apiserver_module() -> None:
    """Same module, same go.mod: the node runs the very release kube-apiserver is."""
    for name in NODE_BINARIES:
        main = (TOOLCHAIN / "kube-apiserver" / name / "main.go").read_text()
        assert "package main" in main
        assert f'"k8s.io/kubernetes/cmd/{name}/app"' in main
        assert not (TOOLCHAIN / "kube-apiserver" / name / "go.mod").exists()
    build = (TOOLCHAIN / "build.sh").read_text()
    assert f"node_binaries=({' '.join(NODE_BINARIES)})" in build
    assert 'cd "$here/kube-apiserver" && go build -ldflags "$kube_ldflags"' in build
    gomod = (TOOLCHAIN / "kube-apiserver" / "go.mod").read_text()
    assert "k8s.io/cri-client => k8s.io/cri-client v0." in gomod


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
        }


def test_an_oci_archive_names_its_image_and_its_blobs_match_their_digests() -> None:
    archive = images.oci_archive(b"\x7fELF-binary", entrypoint="/probe", name="localhost/x/y:1")
    assert archive == images.oci_archive(
        b"\x7fELF-binary", entrypoint="/probe", name="localhost/x/y:1"
    )
    members = _members(archive)
    for name, data in members.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(members["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/x/y:1"
    manifest = json.loads(members["blobs/sha256/" + entry["digest"].split(":")[1]])
    config = json.loads(members["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/probe"]
    # Non-root, so pods run it under the restricted Pod Security profile.
    assert config["config"]["User"] == "65535:65535"
    layer = members["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        (member,) = tar.getmembers()
    assert (member.name, member.mode) == ("probe", 0o755)


def _snapshot(**changes: object) -> host.HostSnapshot:
    base: dict[str, object] = {
        "processes": frozenset({"1 /sbin/init"}),
        "mounts": frozenset({"/ ext4 /dev/vda"}),
        "sysctls": {"kernel/panic_on_oops": "0", "net/ipv4/ip_forward": "0"},
        "cgroups": frozenset({"memory"}),
        "links": frozenset({"lo", "eth0"}),
        "nft_tables": frozenset(),
        "nft_ruleset": "",
        "paths": frozenset(),
        "netns": frozenset(),
    }
    base.update(changes)
    return host.HostSnapshot(**base)  # type: ignore[arg-type]


def test_snapshot_differences_name_every_trace_and_nothing_else() -> None:
    before = _snapshot()
    assert before.differences(_snapshot()) == []
    during = _snapshot(
        links=frozenset({"lo", "eth0", "kcpnode0"}),
        cgroups=frozenset({"memory", "memory/kubepods"}),
        sysctls={"kernel/panic_on_oops": "1", "net/ipv4/ip_forward": "0"},
        nft_tables=frozenset({"ip kube-proxy"}),
        nft_ruleset="table ip kube-proxy {}",
    )
    assert before.differences(during) == [
        "cgroups: new memory/kubepods",
        "links: new kcpnode0",
        "nft_tables: new ip kube-proxy",
        "sysctl kernel/panic_on_oops: 0 -> 1",
    ]
    assert before.differences(_snapshot(nft_ruleset="table ip filter { chain x {} }")) == [
        "nft ruleset changed within existing tables"
    ]


def test_only_cgroups_the_node_made_are_its_traces() -> None:
    """On a shared machine other processes make and remove cgroups under their own while a node
    runs: neither is the node's, and the cleanup must leave them alone."""
    before = _snapshot(cgroups=frozenset({"memory", "memory/sandbox", "memory/sandbox/job-1"}))
    kubelet = {"memory/kubepods", "memory/kubepods/pod-a"}
    others = {"memory", "memory/sandbox", "memory/sandbox/job-2"}
    after = _snapshot(cgroups=frozenset(others | kubelet))
    assert before.node_cgroups(after.cgroups) == kubelet
    assert before.differences(after) == [
        "cgroups: new memory/kubepods",
        "cgroups: new memory/kubepods/pod-a",
    ]
    unified = _snapshot(cgroups=frozenset({".", "system.slice"}))
    assert unified.node_cgroups({".", "system.slice", "system.slice/x", "kubepods"}) == {"kubepods"}


def test_a_snapshot_survives_json_for_the_cleanup_after_a_killed_run() -> None:
    before = _snapshot(paths=frozenset({"/var/lib/cni"}), netns=frozenset({"cni-1"}))
    assert host.HostSnapshot.from_json(before.to_json()) == before


def test_the_configurations_carry_the_host_fixes(tmp_path: Path) -> None:
    containerd = node._containerd_config(tmp_path, tmp_path / "c.sock", tmp_path / "net.d")
    # No CAP_SYS_RESOURCE here: without it every sandbox fails in runc.
    assert "restrict_oom_score_adj = true" in containerd
    assert f'sandbox_image = "{images.pause_image_name()}"' in containerd
    assert f'path = "{tmp_path / "opt"}"' in containerd  # not /opt/containerd
    kubelet = node._kubelet_config(
        tmp_path, tmp_path / "c.sock", {"kubelet": 1, "kubelet-healthz": 2}
    )
    assert kubelet["failCgroupV1"] is False
    assert kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["resolvConf"] == ""
    assert kubelet["imageGCHighThresholdPercent"] == 100
    cni = json.loads(node._cni_conflist(tmp_path))
    (bridge,) = cni["plugins"]
    assert (bridge["bridge"], bridge["ipMasq"]) == (node.BRIDGE, False)
    guard = node._guard_ruleset()
    assert f'iifname "{node.BRIDGE}" oifname != "{node.BRIDGE}" counter drop' in guard
