#!/usr/bin/env bash
# kind end-to-end: builds the image, creates a control-plane cluster and a runtime cluster,
# runs the Compass simulator in the control plane, installs both charts, enables the
# application-connector module in the runtime and waits for the token secret.
#
# Needs Docker (a running engine), kind, kubectl and helm (helm falls back to the one that
# `devenv/toolchain/build.sh` builds). Not part of `make test`.
#   KEEP=1 devenv/kind/e2e.sh   leaves the clusters running
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
kcp=compass-e2e-kcp
rt=compass-e2e-runtime
image=kyma-compass-pull:e2e
sim_image=kyma-compass-pull-sim:e2e
runtime_id=8e1f7a43-3b2c-4d5e-9f60-7a8b9c0d1e2f
tenant=e2e-global-account
work=$(mktemp -d)

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'e2e-kind: %s\n' "$*" >&2; exit 1; }

command -v docker >/dev/null || die "docker is not installed; this end-to-end run needs a Docker engine"
docker info >/dev/null 2>&1 || die "docker is installed but no engine answers (docker info failed); start Docker first"
# shellcheck source=../toolchain/versions.env
source "$repo/devenv/toolchain/versions.env"
kind_bin="${XDG_CACHE_HOME:-$HOME/.cache}/kyma-compass-pull/bin/kind-v$KIND_VERSION"
if ! command -v kind >/dev/null; then
  if [[ ! -x "$kind_bin/kind" ]]; then
    command -v go >/dev/null || die "kind is not installed, and Go (to build kind v$KIND_VERSION) is missing too"
    echo "installing kind v$KIND_VERSION ..."
    GOBIN="$kind_bin" go install "sigs.k8s.io/kind@v$KIND_VERSION"
  fi
  PATH="$kind_bin:$PATH"
fi
command -v kubectl >/dev/null || die "kubectl is not installed"
helm=$(command -v helm || true)
[[ -n "$helm" ]] || helm="$(bash "$repo/devenv/toolchain/build.sh")/helm"

cleanup() {
  if [[ "${KEEP:-}" == 1 ]]; then
    echo "clusters kept: kind get kubeconfig --name $kcp / --name $rt; delete with: kind delete clusters $kcp $rt"
  else
    kind delete clusters "$kcp" "$rt" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step "building images"
docker build -t "$image" "$repo"
docker build -t "$sim_image" --build-arg "PRODUCT_IMAGE=$image" -f "$repo/devenv/kind/compass-sim.Dockerfile" "$repo"

step "creating kind clusters $kcp and $rt"
kind create cluster --name "$kcp" --wait 120s
kind create cluster --name "$rt" --wait 120s
kind load docker-image "$image" "$sim_image" --name "$kcp"
kind load docker-image "$image" --name "$rt"
kk() { kubectl --context "kind-$kcp" "$@"; }
kr() { kubectl --context "kind-$rt" "$@"; }

step "control plane: CRDs, Compass simulator, Kyma CR, runtime kubeconfig"
kk apply -f "$repo/devenv/crds/" -f "$repo/charts/compass-broker/crds/"
kr apply -f "$repo/devenv/crds/"
kk create namespace kcp-system
client_secret=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
kk -n kcp-system create deployment compass-sim --image="$sim_image" --port=8080 -- \
  python -m devenv.compass_sim --host 0.0.0.0 --port 8080 --client-id e2e --client-secret "$client_secret" \
  --public-url http://compass-sim.kcp-system.svc:8080
kk -n kcp-system expose deployment compass-sim --port 8080
kk -n kcp-system rollout status deployment/compass-sim --timeout 120s
cat > "$work/credentials.yaml" <<CREDS
data:
  client_id: e2e
  client_secret: $client_secret
  tokens_endpoint: http://compass-sim.kcp-system.svc:8080/oauth/token
CREDS
kk -n kcp-system create secret generic compass-manager-credentials --from-file=credentials.yaml="$work/credentials.yaml"
# The runtime's API server as the control-plane pods see it: on kind's Docker network.
kind get kubeconfig --internal --name "$rt" > "$work/runtime.kubeconfig"
kk -n kcp-system create secret generic "kubeconfig-$runtime_id" --from-file=config="$work/runtime.kubeconfig"
kk -n kcp-system label secret "kubeconfig-$runtime_id" "operator.kyma-project.io/kyma-name=$runtime_id"
kk apply -f - <<KYMA
apiVersion: operator.kyma-project.io/v1beta2
kind: Kyma
metadata:
  name: $runtime_id
  namespace: kcp-system
  labels:
    kyma-project.io/runtime-id: $runtime_id
    kyma-project.io/global-account-id: $tenant
    kyma-project.io/subaccount-id: e2e-subaccount
    kyma-project.io/shoot-name: c-e2e0001
    operator.kyma-project.io/kyma-name: $runtime_id
spec:
  channel: regular
  modules: [{name: application-connector}]
KYMA

step "installing the broker chart"
"$helm" upgrade --install compass-broker "$repo/charts/compass-broker" --namespace kcp-system \
  --set image.repository="${image%:*}" --set image.tag="${image#*:}" --set image.pullPolicy=Never \
  --set director.url=http://compass-sim.kcp-system.svc:8080/director/graphql \
  --set service.type=NodePort --wait --timeout 180s
node_port=$(kk -n kcp-system get service compass-broker -o jsonpath='{.spec.ports[0].nodePort}')
kcp_ip=$(docker inspect -f '{{.NetworkSettings.Networks.kind.IPAddress}}' "$kcp-control-plane")

step "runtime: Kyma with the module enabled, agent chart"
kr create namespace kyma-system
kr apply -f - <<KYMA
apiVersion: operator.kyma-project.io/v1beta2
kind: Kyma
metadata:
  name: default
  namespace: kyma-system
  labels: {kyma-project.io/runtime-id: $runtime_id}
spec:
  modules: [{name: application-connector}]
KYMA
"$helm" upgrade --install compass-agent "$repo/charts/compass-agent" --namespace kyma-system \
  --set image.repository="${image%:*}" --set image.tag="${image#*:}" --set image.pullPolicy=Never \
  --set broker.url="http://$kcp_ip:$node_port" --wait --timeout 180s

step "waiting for kyma-system/compass-agent-configuration"
for _ in $(seq 1 90); do
  if kr -n kyma-system get secret compass-agent-configuration >/dev/null 2>&1; then
    keys=$(kr -n kyma-system get secret compass-agent-configuration -o jsonpath='{.data}' | tr -d '{}"' | tr ',' '\n' | cut -d: -f1 | sort | tr '\n' ' ')
    echo "secret written with keys: $keys"
    [[ "$keys" == "CONNECTOR_URL RUNTIME_ID TENANT TOKEN " ]] || die "unexpected keys: $keys"
    echo "e2e-kind: runtime connected"
    exit 0
  fi
  sleep 2
done
kr -n kyma-system logs deployment/compass-agent --tail 50 || true
kk -n kcp-system logs deployment/compass-broker --tail 50 || true
die "no token secret after 180 s"
