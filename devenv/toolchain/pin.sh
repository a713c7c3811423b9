#!/usr/bin/env bash
# Regenerates go.mod and go.sum of the kube-apiserver and etcd modules from
# versions.env. Every k8s.io staging module that k8s.io/kubernetes replaces
# with ./staging/... is replaced with its published v0.X.Y instead, because
# that is the only way the upstream main packages build outside their repo.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
command -v go >/dev/null || { echo "pin.sh: the Go toolchain is needed (install Go >= 1.26)" >&2; exit 1; }

staging_version="v0.${KUBERNETES_VERSION#1.}"

# The kube-apiserver module also holds the node's mains (kubelet/, kube-controller-manager/,
# kube-scheduler/, kube-proxy/): `go mod tidy` pins what they need too, at the same release.
pin_kube_apiserver() {
  local dir="$here/kube-apiserver"
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init kyma-compass-pull/devenv/toolchain/kube-apiserver >/dev/null 2>&1)
  local upstream_mod
  upstream_mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  local args=(-require "k8s.io/kubernetes@v$KUBERNETES_VERSION")
  while read -r module; do
    args+=(-replace "$module=$module@$staging_version")
  done < <(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$upstream_mod")
  (cd "$dir" && go mod edit -go=1.26.0 "${args[@]}" && go mod tidy)
}

pin_etcd() {
  local dir="$here/etcd"
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init kyma-compass-pull/devenv/toolchain/etcd >/dev/null 2>&1 \
    && go mod edit -go=1.26.0 -require "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" && go mod tidy)
}

# kubectl from its published staging module of the same release (k8s.io/kubectl v0.X.Y is
# k8s.io/kubernetes v1.X.Y's staging/src/k8s.io/kubectl), with client-go and component-base
# of that release.
pin_kubectl() {
  local dir="$here/kubectl"
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init kyma-compass-pull/devenv/toolchain/kubectl >/dev/null 2>&1 \
    && go mod edit -go=1.26.0 \
      -require "k8s.io/kubectl@$staging_version" \
      -require "k8s.io/client-go@$staging_version" \
      -require "k8s.io/component-base@$staging_version" \
    && go mod tidy)
}

pin_promql_check() {
  local dir="$here/promql-check"
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init kyma-compass-pull/devenv/toolchain/promql-check >/dev/null 2>&1 \
    && go mod edit -go=1.26.0 -require "github.com/prometheus/prometheus@v$PROMETHEUS_MODULE_VERSION" \
    && go mod tidy)
}

pin_kube_apiserver
pin_etcd
pin_kubectl
pin_promql_check
echo "pinned kubernetes v$KUBERNETES_VERSION (staging $staging_version, kubectl $staging_version), etcd v$ETCD_VERSION"
