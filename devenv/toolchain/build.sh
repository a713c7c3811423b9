#!/usr/bin/env bash
# Prints the folder that holds kube-apiserver, etcd, helm and kubectl, building them
# first when needed. Progress goes to stderr; stdout is only the folder.
#
#   KUBEBUILDER_ASSETS=<dir>  use the binaries there instead (envtest convention)
#   XDG_CACHE_HOME            where the build cache lives (default ~/.cache)
#
# `build.sh promql-check` prints the path of promql-check instead (Prometheus's rule and PromQL
# parser, for the chart tests), built once into the same cache; KUBEBUILDER_ASSETS plays no part.
#
# `build.sh node` prints the same folder after also building kubelet, kube-controller-manager,
# kube-scheduler and kube-proxy (devenv/node's real node): the same release, from the same Go
# module as kube-apiserver (its go.mod pins them all), in one `go build`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
binaries=(kube-apiserver etcd helm kubectl)
node_binaries=(kubelet kube-controller-manager kube-scheduler kube-proxy)

say() { echo "toolchain: $*" >&2; }
die() { say "$*"; exit 1; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kyma-compass-pull"

if [[ "${1:-}" == promql-check ]]; then
  dir="$cache/bin/promql-check-v$PROMETHEUS_MODULE_VERSION"
  if [[ ! -x "$dir/promql-check" ]]; then
    command -v go >/dev/null || die "the Go toolchain (>= 1.26) is needed to build promql-check"
    grep -q "github.com/prometheus/prometheus v$PROMETHEUS_MODULE_VERSION" "$here/promql-check/go.mod" \
      || die "$here/promql-check/go.mod does not pin prometheus v$PROMETHEUS_MODULE_VERSION: run devenv/toolchain/pin.sh"
    mkdir -p "$dir"
    exec 9>"$dir/.lock"
    flock 9
    if [[ ! -x "$dir/promql-check" ]]; then
      say "building promql-check (about a minute the first time) ..."
      (cd "$here/promql-check" && GOFLAGS="-mod=readonly -buildvcs=false -trimpath" \
        go build -ldflags "-s -w" -o "$dir/promql-check.partial" .)
      mv "$dir/promql-check.partial" "$dir/promql-check"
    fi
  fi
  echo "$dir/promql-check"
  exit 0
fi

if [[ "${1:-}" == node ]]; then
  binaries+=("${node_binaries[@]}")
elif [[ -n "${1:-}" ]]; then
  die "unknown argument '$1' (none, node or promql-check)"
fi

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for b in "${binaries[@]}"; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable '$b'"
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

bindir="$cache/bin/k8s-v$KUBERNETES_VERSION-etcd-v$ETCD_VERSION-helm-v$HELM_VERSION"

missing=()
for b in "${binaries[@]}"; do [[ -x "$bindir/$b" ]] || missing+=("$b"); done
if (( ${#missing[@]} == 0 )); then echo "$bindir"; exit 0; fi

command -v go >/dev/null || die "the Go toolchain (>= 1.26) is needed to build ${missing[*]}: install it (apt-get install golang-go, or go.dev/dl), or set KUBEBUILDER_ASSETS to a folder holding kube-apiserver, etcd, helm and kubectl"

require_pinned() {
  local gomod="$here/$1/go.mod" want="$2"
  grep -q "$want" "$gomod" || die "$gomod does not pin $want: run devenv/toolchain/pin.sh after changing versions.env"
}
require_pinned kube-apiserver "k8s.io/kubernetes v$KUBERNETES_VERSION"
require_pinned etcd "go.etcd.io/etcd/server/v3 v$ETCD_VERSION"
# kubectl's published module of the same release: k8s.io/kubectl v0.X.Y for Kubernetes v1.X.Y.
require_pinned kubectl "k8s.io/kubectl v0.${KUBERNETES_VERSION#1.}"

mkdir -p "$bindir"
# One build at a time: parallel test runs on a cold cache wait for the first one.
exec 9>"$bindir/.lock"
if ! flock -n 9; then
  say "another build is running; waiting for it ..."
  flock 9
fi
missing=()
for b in "${binaries[@]}"; do [[ -x "$bindir/$b" ]] || missing+=("$b"); done
if (( ${#missing[@]} == 0 )); then echo "$bindir"; exit 0; fi
export GOFLAGS="-mod=readonly -buildvcs=false -trimpath"

build_one() {
  local name="$1" ldflags="$2" start=$SECONDS
  say "building $name (several minutes the first time; Go's cache makes later builds fast) ..."
  (cd "$here/$name" && go build -ldflags "$ldflags" -o "$bindir/$name.partial" .)
  mv "$bindir/$name.partial" "$bindir/$name"
  say "built $name in $((SECONDS - start))s"
}

v="v$KUBERNETES_VERSION"; major="${KUBERNETES_VERSION%%.*}"; minor="${KUBERNETES_VERSION#*.}"; minor="${minor%%.*}"
# What every binary of the kube-apiserver module reports as its version (node status, /version).
kube_ldflags="-s -w \
  -X k8s.io/component-base/version.gitVersion=$v \
  -X k8s.io/component-base/version.gitMajor=$major \
  -X k8s.io/component-base/version.gitMinor=$minor \
  -X k8s.io/component-base/version.gitTreeState=clean \
  -X k8s.io/client-go/pkg/version.gitVersion=$v"

# The node's binaries in one `go build` (their packages overlap: one compile of each), into a
# folder of its own first, so an interrupted build leaves none of them half-written.
node_missing=()
for b in "${missing[@]}"; do
  for n in "${node_binaries[@]}"; do [[ "$b" == "$n" ]] && node_missing+=("$b"); done
done
if (( ${#node_missing[@]} > 0 )); then
  start=$SECONDS
  say "building ${node_missing[*]} (about 7 minutes from an empty Go cache, 2-3 with kube-apiserver's) ..."
  partial="$bindir/.node.partial"
  rm -rf "$partial" && mkdir -p "$partial"
  (cd "$here/kube-apiserver" && go build -ldflags "$kube_ldflags" -o "$partial/" "${node_missing[@]/#/./}")
  for n in "${node_missing[@]}"; do mv "$partial/$n" "$bindir/$n"; done
  rmdir "$partial"
  say "built ${node_missing[*]} in $((SECONDS - start))s"
fi

for b in "${missing[@]}"; do
  case "$b" in
    kubelet|kube-controller-manager|kube-scheduler|kube-proxy) ;;
    kube-apiserver)
      build_one kube-apiserver "$kube_ldflags" ;;
    etcd)
      build_one etcd "-s -w" ;;
    kubectl)
      build_one kubectl "-s -w \
        -X k8s.io/component-base/version.gitVersion=$v \
        -X k8s.io/component-base/version.gitMajor=$major \
        -X k8s.io/component-base/version.gitMinor=$minor \
        -X k8s.io/component-base/version.gitTreeState=clean \
        -X k8s.io/client-go/pkg/version.gitVersion=$v \
        -X k8s.io/client-go/pkg/version.gitMajor=$major \
        -X k8s.io/client-go/pkg/version.gitMinor=$minor" ;;
    helm)
      start=$SECONDS
      say "installing helm v$HELM_VERSION ..."
      GOFLAGS="-buildvcs=false -trimpath" GOBIN="$bindir" go install -ldflags "-s -w" "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION" \
        2> >(grep -v '^go: downloading' >&2)
      say "installed helm in $((SECONDS - start))s" ;;
  esac
done
echo "$bindir"
