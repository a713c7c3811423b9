#!/usr/bin/env bash
# Prints the folder that holds the real Compass Connector (`connector`), hydrator (`hydrator`)
# and ORY Oathkeeper (`oathkeeper-<version>/oathkeeper`), building them first when needed.
# Progress goes to stderr; stdout is only the folder (the Director's, from build.sh).
#
#   build-connector.sh                 build (or reuse) and print the folder
#   build-connector.sh --find-source   print the folder when everything is built, or where the
#                                      sources would come from; build nothing
#
# Connector and hydrator come from the pinned Compass tree that build.sh unpacks (same commit,
# same cache folder). The hydrator requires the Connector module at a pseudo-version the module
# proxy refuses, so its go.mod (in the cached copy only) is pointed at the tree's own folder.
# Oathkeeper is the version Compass's chart ran, from the Go module proxy.
#
# Exit codes: 0 ok; 3 a source cannot be had (the Compass tree, or Oathkeeper from the module
# proxy; the one line on stderr says why, and tests skip with it); anything else a failed build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

OATHKEEPER_MODULE=github.com/ory/oathkeeper
OATHKEEPER_VERSION=v0.40.6

say() { echo "real-connector: $*" >&2; }
die() { say "$*"; exit 1; }
no_source() { say "$*"; exit 3; }

binaries_in() {
  [[ -x "$1/connector" && -x "$1/hydrator" && -x "$1/oathkeeper-$OATHKEEPER_VERSION/oathkeeper" ]]
}

if [[ "${1:-}" == "--find-source" ]]; then
  found=$(bash "$here/build.sh" --find-source) || exit $?
  if [[ -d "$found" ]] && binaries_in "$found"; then echo "$found"; exit 0; fi
  echo "$found"
  exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument '$1' (usage: build-connector.sh [--find-source])"

# The Director's folder: its unpacked tree is where Connector and hydrator come from.
root=$(bash "$here/build.sh") || exit $?
if binaries_in "$root"; then echo "$root"; exit 0; fi
command -v go >/dev/null || die "the Go toolchain (>= 1.26) is needed: install it (apt-get install golang-go, or go.dev/dl)"

exec 9>"$root/.connector.lock"
if ! flock -n 9; then
  say "another build is running; waiting for it ..."
  flock 9
fi
if binaries_in "$root"; then echo "$root"; exit 0; fi

components="$root/compass/components"
for module in connector hydrator; do
  [[ -f "$components/$module/go.mod" ]] || no_source "the cached Compass tree lacks components/$module (delete $root to unpack it again)"
done

export GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
quiet() { "$@" 2> >(grep -v '^go: downloading' >&2); }

build_component() {  # name, package folder under components/
  local name=$1 start=$SECONDS
  say "building the $name at the pinned commit ..."
  (cd "$components/$name" && quiet go build -ldflags "-s -w" -o "$root/$name.partial" ./cmd)
  mv "$root/$name.partial" "$root/$name"
  say "built the $name in $((SECONDS - start))s"
}

if [[ ! -x "$root/connector" ]]; then
  build_component connector
fi
if [[ ! -x "$root/hydrator" ]]; then
  (cd "$components/hydrator" &&
    go mod edit -replace "github.com/kyma-incubator/compass/components/connector=../connector")
  build_component hydrator
fi

oathkeeper_dir="$root/oathkeeper-$OATHKEEPER_VERSION"
if [[ ! -x "$oathkeeper_dir/oathkeeper" ]]; then
  start=$SECONDS
  say "fetching $OATHKEEPER_MODULE@$OATHKEEPER_VERSION from the Go module proxy ..."
  # Outside any module: `go mod download` of one module version, printing where it put it.
  if ! info=$(cd / && GOFLAGS= go mod download -json "$OATHKEEPER_MODULE@$OATHKEEPER_VERSION" 2>&1); then
    no_source "$OATHKEEPER_MODULE@$OATHKEEPER_VERSION cannot be had from the Go module proxy ($(echo "$info" | grep -m1 -o '"Error": *"[^"]*"' || echo "$info" | tail -1))"
  fi
  module_dir=$(echo "$info" | sed -n 's/^[[:space:]]*"Dir": *"\(.*\)",*$/\1/p')
  [[ -d "$module_dir" ]] || die "go mod download printed no module folder: $info"
  # The module cache is read-only and `go build` of a module with replace directives needs
  # its own module root: build in a writable copy.
  work="$oathkeeper_dir/src.partial"
  rm -rf "$work"
  mkdir -p "$oathkeeper_dir"
  cp -r "$module_dir" "$work"
  chmod -R u+w "$work"
  say "building Oathkeeper $OATHKEEPER_VERSION ..."
  (cd "$work" && quiet go build -ldflags "-s -w" -o "$oathkeeper_dir/oathkeeper.partial" .)
  rm -rf "$work"
  mv "$oathkeeper_dir/oathkeeper.partial" "$oathkeeper_dir/oathkeeper"
  say "built Oathkeeper in $((SECONDS - start))s"
fi
echo "$root"
