#!/usr/bin/env bash
# Installs from Debian's packages what devenv/node needs to run a real node, when it is missing:
# containerd (with runc), the CNI plugins (bridge, host-local, loopback) and nftables (kube-proxy's
# nftables mode and the node's own egress table). Needs root and apt-get; .ci/run calls it. Only
# the binaries are used: devenv/node starts its own containerd, never the system service.
set -euo pipefail
say() { echo "node host packages: $*" >&2; }

declare -A wanted=(
  [containerd]=/usr/bin/containerd
  [runc]=/usr/sbin/runc
  [containernetworking-plugins]=/usr/lib/cni/bridge
  [nftables]=/usr/sbin/nft
)
missing=()
for package in "${!wanted[@]}"; do
  [[ -x "${wanted[$package]}" ]] || missing+=("$package")
done
if (( ${#missing[@]} == 0 )); then exit 0; fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  say "not installing ${missing[*]} (needs root and apt-get): the real-node tests will skip and say why"
  exit 0
fi
say "installing ${missing[*]} ..."
apt-get update -qq
# No service is started here (devenv/node runs its own containerd); where the image has no
# policy-rc.d, the package's own start of the system containerd is harmless and left alone.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
