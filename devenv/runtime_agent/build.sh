#!/usr/bin/env bash
# Prints the folder that holds Kyma's real compass-runtime-agent, building it first when needed
# from the pinned application-connector-manager source. Progress goes to stderr; stdout is only
# the folder.
#
#   RUNTIME_AGENT_SRC=<tar.gz>  the source (a `git archive` of application-connector-manager with
#                               the prefix application-connector-manager/); default: the pinned
#                               tarball in ../shared/compass-src/ or ../../shared/compass-src/
#                               relative to the repository root
#   XDG_CACHE_HOME              where the build cache lives (default ~/.cache)
#
# Exit codes: 0 built or cached, 3 no source to be had (callers skip), 1 anything else.
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tarball_name=application-connector-manager-859cac3.tar.gz
# The commit the tarball was cut from; a tarball from another commit is refused, so the cache
# key always names what was built.
pinned_commit=859cac3cab9471c63c30b912fffc28d89b50c943

say() { echo "runtime-agent: $*" >&2; }
die() { say "$*"; exit 1; }

cache="${XDG_CACHE_HOME:-$HOME/.cache}/kyma-compass-pull"
bindir="$cache/runtime-agent/$pinned_commit"
binary="$bindir/compass-runtime-agent"
# Built before (the cache key is the pinned commit): no source needed, as for the Director.
if [[ -x "$binary" ]]; then echo "$bindir"; exit 0; fi

src="${RUNTIME_AGENT_SRC:-}"
if [[ -z "$src" ]]; then
  for candidate in "$root/../shared/compass-src/$tarball_name" "$root/../../shared/compass-src/$tarball_name"; do
    if [[ -f "$candidate" ]]; then src="$candidate"; break; fi
  done
fi
if [[ -z "$src" || ! -f "$src" ]]; then
  say "the compass-runtime-agent source is not here (set RUNTIME_AGENT_SRC to $tarball_name, a git archive of kyma-project/application-connector-manager at $pinned_commit)"
  exit 3
fi

command -v go >/dev/null || die "the Go toolchain (>= 1.26) is needed to build compass-runtime-agent"
command -v git >/dev/null || die "git is needed to read the source tarball's commit"
commit=$(gzip -dc "$src" | git get-tar-commit-id || true)
[[ "$commit" == "$pinned_commit" ]] || die "$src was cut from commit '${commit:-unknown}', not the pinned $pinned_commit"

mkdir -p "$bindir"
# One build at a time: parallel test runs on a cold cache wait for the first one.
exec 9>"$bindir/.lock"
if ! flock -n 9; then
  say "another build is running; waiting for it ..."
  flock 9
fi
if [[ -x "$binary" ]]; then echo "$bindir"; exit 0; fi

work=$(mktemp -d "$bindir/.src.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xzf "$src" -C "$work"
module="$work/application-connector-manager/components/compass-runtime-agent"
[[ -f "$module/go.mod" ]] || die "$src has no components/compass-runtime-agent/go.mod"
start=$SECONDS
say "building compass-runtime-agent at ${pinned_commit:0:7} (about 2 minutes and 1 GB the first time) ..."
(
  cd "$module"
  # The sibling module is required at a pseudo-version the module proxy refuses; the tarball
  # carries it.
  go mod edit -replace "github.com/kyma-project/application-connector-manager/components/central-application-gateway=../central-application-gateway"
  GOFLAGS="-mod=mod -buildvcs=false -trimpath" go build -ldflags "-s -w" -o "$binary.partial" ./cmd \
    2> >(grep -v '^go: downloading' >&2)
)
mv "$binary.partial" "$binary"
say "built compass-runtime-agent in $((SECONDS - start))s"
echo "$bindir"
