#!/usr/bin/env bash
# Prints the folder that holds the real Compass Director binary (`director`) and the
# source tree it was built from (`compass/`: migrations, local config), building it
# first when needed. Progress goes to stderr; stdout is only the folder.
#
#   build.sh                 build (or reuse) and print the folder
#   build.sh --find-source   print the source that would be used, build nothing
#
#   COMPASS_SRC=<path>  the pinned source: a tarball made with `git archive --prefix=compass/`,
#                       or an unpacked tree (the folder holding `components/`, or its parent)
#   XDG_CACHE_HOME      where the build cache lives (default ~/.cache)
#
# Exit codes: 0 ok; 3 the source cannot be found (the one line on stderr says why; tests
# skip with it); anything else a failed build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

# The Director is pinned: migrations, GraphQL schema and the facts in docs/real-compass.md
# belong to this commit. The cache key is the commit, so a new pin builds afresh.
COMMIT=a423d60704
TARBALL=compass-$COMMIT.tar.gz
SIBLINGS=(hydrator operations-controller system-broker connector)

say() { echo "real-director: $*" >&2; }
die() { say "$*"; exit 1; }
no_source() { say "$*"; exit 3; }

cache="${XDG_CACHE_HOME:-$HOME/.cache}/kyma-compass-pull"
root="$cache/real-director-$COMMIT"

# A tree is usable when it holds the Director's module and its migrations.
is_tree() { [[ -f "$1/components/director/go.mod" && -d "$1/components/schema-migrator/migrations/director" ]]; }

find_source() {
  if [[ -n "${COMPASS_SRC:-}" ]]; then
    local src="$COMPASS_SRC"
    if [[ -f "$src" ]]; then echo "$src"; return 0; fi
    if [[ -d "$src" ]]; then
      if is_tree "$src"; then (cd "$src" && pwd); return 0; fi
      if is_tree "$src/compass"; then (cd "$src/compass" && pwd); return 0; fi
      no_source "COMPASS_SRC=$src holds no compass tree (components/director/go.mod and the director migrations)"
    fi
    no_source "COMPASS_SRC=$src does not exist"
  fi
  local candidate
  for candidate in "$repo/../shared/compass-src/$TARBALL" "$repo/../../shared/compass-src/$TARBALL"; do
    if [[ -f "$candidate" ]]; then
      echo "$(cd "$(dirname "$candidate")" && pwd)/$TARBALL"
      return 0
    fi
  done
  no_source "the Compass source is not here: set COMPASS_SRC to $TARBALL or an unpacked compass tree at commit $COMMIT (git clone https://github.com/kyma-incubator/compass), or put the tarball in ../shared/compass-src/"
}

complete() { [[ -x "$root/director" ]] && is_tree "$root/compass"; }

if [[ "${1:-}" == "--find-source" ]]; then
  if complete; then echo "$root"; exit 0; fi
  find_source
  exit 0
fi
[[ $# -eq 0 ]] || die "unknown argument '$1' (usage: build.sh [--find-source])"

if complete; then echo "$root"; exit 0; fi
src=$(find_source)  # exits 3 on its own when there is none
command -v go >/dev/null || die "the Go toolchain (>= 1.26) is needed to build the Director: install it (apt-get install golang-go, or go.dev/dl)"

mkdir -p "$root"
# One build at a time: parallel test runs on a cold cache wait for the first one.
exec 9>"$root/.lock"
if ! flock -n 9; then
  say "another build is running; waiting for it ..."
  flock 9
fi
if complete; then echo "$root"; exit 0; fi

start=$SECONDS
# Unpack into a fresh folder and rename at the end: an interrupted run leaves no half tree
# that `complete` could take for a finished one.
rm -rf "$root/compass.partial" "$root/compass"
mkdir -p "$root/compass.partial"
if [[ -f "$src" ]]; then
  say "unpacking $src ..."
  tar -xzf "$src" -C "$root/compass.partial" --strip-components=1
else
  say "copying $src ..."
  cp -a "$src/." "$root/compass.partial/"
fi
is_tree "$root/compass.partial" || die "$src holds no compass tree (components/director/go.mod and the director migrations)"

# The Director requires its sibling modules at pseudo-versions the module proxy refuses;
# the same tree holds them, so point the (cached copy's) go.mod at it.
director="$root/compass.partial/components/director"
for sibling in "${SIBLINGS[@]}"; do
  [[ -f "$root/compass.partial/components/$sibling/go.mod" ]] || die "$src lacks components/$sibling, which the Director's go.mod needs"
  (cd "$director" && go mod edit -replace "github.com/kyma-incubator/compass/components/$sibling=../$sibling")
done
mv "$root/compass.partial" "$root/compass"

say "building the Director at $COMMIT (about 5 minutes on 2 cores the first time; Go's cache makes later builds fast) ..."
# `go: downloading` lines (a hundred of them) would bury the one line that matters on failure.
(cd "$root/compass/components/director" &&
  GOFLAGS="-mod=readonly -buildvcs=false -trimpath" go build -ldflags "-s -w" -o "$root/director.partial" ./cmd/director) \
  2> >(grep -v '^go: downloading' >&2)
mv "$root/director.partial" "$root/director"
say "built the Director in $((SECONDS - start))s"
echo "$root"
