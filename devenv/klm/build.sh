#!/usr/bin/env bash
# Prints the folder that holds Kyma's real lifecycle-manager (KLM) built at the pinned commit,
# building it first when needed: `<folder>/lifecycle-manager/` is the source tree with the
# binary in `bin/manager` (KLM loads its watcher manifest from `../skr-webhook/` beside its
# executable, and its CRDs are in `config/`), and `bin/ocm-registry-<hash>` is our OCI registry that
# holds a module as modulectl and `ocm transfer` lay it out (devenv/klm/ocmregistry).
# Progress goes to stderr; stdout is the folder, then the registry's binary (its name carries the
# hash of its source: checkouts at different commits share the cache, each uses its own).
#
#   build.sh                 build (or reuse) and print the folder and the registry
#   build.sh --find-source   print the sources that would be used, build nothing
#
#   KLM_SRC=<path>   kyma-project/lifecycle-manager at the pinned commit: a tarball made with
#                    `git archive --prefix=lifecycle-manager/`, or an unpacked tree
#   OCM_SRC=<path>   open-component-model/ocm at the tag KLM's go.mod names, the same way
#                    (`--prefix=ocm/`)
#   XDG_CACHE_HOME   where the build cache lives (default ~/.cache); without KLM_SRC/OCM_SRC
#                    the sources are looked for in <cache>/kyma-compass-pull/src/
#
# Exit codes: 0 ok; 3 a source cannot be found (the one line on stderr says why; tests skip
# with it); anything else a failed build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# KLM is pinned: the flags, CRDs, labels and the OCI layout in docs/module.md belong to this
# commit. The cache key is the commit, so a new pin builds afresh.
KLM_COMMIT=c5b83f1b542602bb27a5fd950319cca354d189f1
# The ocm.software/ocm version KLM's go.mod requires; the module proxy refuses that module, so
# it is built from its source with a `replace`.
OCM_TAG=v0.47.0
OCM_COMMIT=c5a081651bc37d8c0f52f014128d10ecf9b957f2

say() { echo "klm: $*" >&2; }
die() { say "$*"; exit 1; }
no_source() { say "$*"; exit 3; }

cache="${XDG_CACHE_HOME:-$HOME/.cache}/kyma-compass-pull"
root="$cache/klm-${KLM_COMMIT:0:10}"
tree="$root/lifecycle-manager"
registry_src="$here/ocmregistry/main.go"
# The registry is ours and changes with this repository: its binary is keyed by its source.
registry_key=$(sha256sum "$registry_src" | cut -c1-12)
registry_bin="$root/bin/ocm-registry-$registry_key"

is_klm() { [[ -f "$1/go.mod" && -d "$1/skr-webhook" && -d "$1/config/crd/bases" ]] && grep -q '^module github.com/kyma-project/lifecycle-manager$' "$1/go.mod"; }
is_ocm() { [[ -f "$1/go.mod" ]] && grep -q '^module ocm.software/ocm$' "$1/go.mod"; }

# $1 what, $2 env value, $3 default tarball, $4 prefix, $5 commit, $6 tree check
find_one() {
  local what=$1 given=$2 default=$3 prefix=$4 commit=$5 check=$6 src
  src=${given:-$default}
  if [[ -d "$src" ]]; then
    if $check "$src"; then (cd "$src" && pwd); return 0; fi
    if $check "$src/$prefix"; then (cd "$src/$prefix" && pwd); return 0; fi
    no_source "$src holds no $what tree"
  fi
  if [[ -f "$src" ]]; then
    local got
    got=$(gzip -dc "$src" | git get-tar-commit-id || true)
    [[ "$got" == "$commit" ]] || die "$src was cut from commit '${got:-unknown}', not the pinned $commit"
    echo "$src"; return 0
  fi
  if [[ -n "$given" ]]; then no_source "$given does not exist"; fi
  return 1
}

find_sources() {
  klm_src=$(find_one "lifecycle-manager" "${KLM_SRC:-}" "$cache/src/lifecycle-manager-${KLM_COMMIT:0:7}.tar.gz" \
    lifecycle-manager "$KLM_COMMIT" is_klm) ||
    no_source "the lifecycle-manager source is not here: set KLM_SRC to a git archive (--prefix=lifecycle-manager/) or a tree of github.com/kyma-project/lifecycle-manager at $KLM_COMMIT, or put lifecycle-manager-${KLM_COMMIT:0:7}.tar.gz in $cache/src/"
  ocm_src=$(find_one "ocm" "${OCM_SRC:-}" "$cache/src/ocm-$OCM_TAG.tar.gz" ocm "$OCM_COMMIT" is_ocm) ||
    no_source "the OCM source is not here: set OCM_SRC to a git archive (--prefix=ocm/) or a tree of github.com/open-component-model/ocm at $OCM_TAG, or put ocm-$OCM_TAG.tar.gz in $cache/src/"
}

klm_built() { [[ -x "$tree/bin/manager" ]] && is_klm "$tree"; }
complete() { klm_built && [[ -x "$registry_bin" ]]; }

publish() { printf '%s\n%s\n' "$root" "$registry_bin"; }

if [[ "${1:-}" == "--find-source" ]]; then
  if complete; then echo "$root"; exit 0; fi
  find_sources
  printf '%s\n%s\n' "$klm_src" "$ocm_src"
  exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument '$1' (usage: build.sh [--find-source])"
if complete; then publish; exit 0; fi

unpack() {  # $1 source (tarball or tree), $2 destination
  rm -rf "$2.partial" "$2"
  mkdir -p "$2.partial"
  if [[ -f "$1" ]]; then tar -xzf "$1" -C "$2.partial" --strip-components=1; else cp -a "$1/." "$2.partial/"; fi
  mv "$2.partial" "$2"
}

mkdir -p "$root/bin"
# One build at a time: parallel test runs on a cold cache wait for the first one.
exec 9>"$root/.lock"
if ! flock -n 9; then
  say "another build is running; waiting for it ..."
  flock 9
fi
if complete; then publish; exit 0; fi
command -v go >/dev/null || die "the Go toolchain (>= 1.26) is needed to build lifecycle-manager: install it (apt-get install golang-go, or go.dev/dl)"
export GOFLAGS="-mod=mod -buildvcs=false -trimpath"
start=$SECONDS

if ! klm_built; then
  find_sources
  unpack "$ocm_src" "$root/ocm"
  is_ocm "$root/ocm" || die "$ocm_src holds no ocm tree"
  unpack "$klm_src" "$tree"
  is_klm "$tree" || die "$klm_src holds no lifecycle-manager tree"
  (cd "$tree" && go mod edit -replace "ocm.software/ocm=../ocm")
  say "building lifecycle-manager at ${KLM_COMMIT:0:7} (about 6 minutes and 2.7 GB the first time) ..."
  # `go: downloading` lines (hundreds) would bury the one line that matters on failure.
  (cd "$tree" && go build -ldflags "-s -w -X main.buildVersion=${KLM_COMMIT:0:7}" -o bin/manager.partial ./cmd) \
    2> >(grep -v '^go: downloading' >&2)
  mv "$tree/bin/manager.partial" "$tree/bin/manager"
fi

# Inside KLM's module, so it uses the go-containerregistry KLM itself pins, with no go.sum of ours.
mkdir -p "$tree/hack/compass-pull-ocm-registry"
cp "$registry_src" "$tree/hack/compass-pull-ocm-registry/main.go"
[[ $(sha256sum "$tree/hack/compass-pull-ocm-registry/main.go" | cut -c1-12) == "$registry_key" ]] ||
  die "$registry_src changed during the build: run it again"
(cd "$tree" && go build -ldflags "-s -w" -o "$registry_bin.partial" ./hack/compass-pull-ocm-registry) \
  2> >(grep -v '^go: downloading' >&2)
mv "$registry_bin.partial" "$registry_bin"
# Registries of other sources may serve another checkout now; a week unbuilt, they serve none.
find "$root/bin" -name 'ocm-registry-*' ! -name "$(basename "$registry_bin")" -mtime +7 -delete
say "built in $((SECONDS - start))s"
publish
