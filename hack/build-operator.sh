#!/usr/bin/env bash
# Build SchedMD's slurm-operator (manager; webhook from v1.1 on) from the Go module proxy, once per
# version, into ~/.cache/healer/bin/slurm-operator-<version>/, with the CRDs of that version next to
# the binaries (crds/, from the module's helm/slurm-operator-crds chart).
#
# `go install …@version` is refused by the proxy here (it will not list versions), so the exact
# version is fetched with `go mod download` and built from a writable copy. A warm cache returns at
# once. env: HEALER_CACHE (default ~/.cache/healer), OPERATOR_VERSIONS (default "v1.1.0 v1.0.0").
#
# The operator pins its Slurm client (github.com/SlinkyProject/slurm-client) at its own version.
# Where the proxy refuses that exact client version (it refuses slurm-client v1.1.0 here: "403
# Forbidden: This module version is not available"), the build falls back to the newest client
# the proxy serves of the same API (SLURM_CLIENT_FALLBACK, v1.0.1: the same slurmrestd v0.0.44
# API) and says so in BUILD-INFO next to the binaries.
set -euo pipefail

CACHE=${HEALER_CACHE:-$HOME/.cache/healer}
VERSIONS=${OPERATOR_VERSIONS:-v1.1.0 v1.0.0}
MODULE=github.com/SlinkyProject/slurm-operator
CLIENT=github.com/SlinkyProject/slurm-client
CLIENT_FALLBACK=${SLURM_CLIENT_FALLBACK:-v1.0.1}
export GOTOOLCHAIN=local GOWORK=off GOFLAGS="-modcacherw -buildvcs=false" CGO_ENABLED=0
export GOPROXY=${GOPROXY:-https://proxy.golang.org}
JOBS=${GO_BUILD_JOBS:-2}

log() { printf '[build-operator] %s\n' "$*" >&2; }

TMPS=()
cleanup() { for t in "${TMPS[@]}"; do rm -rf "$t"; done; }
trap cleanup EXIT

build() { # build VERSION
  local v=$1 dest=$CACHE/bin/slurm-operator-$1 bins="manager" src w tmp b
  case $v in v1.0.*) ;; *) bins="manager webhook" ;; esac
  local ok=1
  for b in $bins; do [ -x "$dest/$b" ] || ok=0; done
  [ -d "$dest/crds" ] || ok=0
  [ $ok = 1 ] && return 0
  log "building slurm-operator $v: $bins (first run only; about 10 minutes a binary on 2 cores)"
  src=$(go mod download -json "$MODULE@$v" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  w=$CACHE/build/slurm-operator-$v
  rm -rf "$w"; mkdir -p "$(dirname "$w")"; cp -r "$src" "$w"; chmod -R u+w "$w"
  tmp=$(mktemp -d "$CACHE/bin/.slurm-operator-$v.XXXX"); TMPS+=("$tmp")
  local pinned used modflag=""
  pinned=$(awk -v m="$CLIENT" '$1==m{print $2; exit}' "$w/go.mod")
  used=$pinned
  if ! go mod download "$CLIENT@$pinned" 2>/dev/null; then
    log "the proxy refuses $CLIENT@$pinned; building against $CLIENT@$CLIENT_FALLBACK"
    go mod download "$CLIENT@$CLIENT_FALLBACK"
    (cd "$w" && go mod edit -require="$CLIENT@$CLIENT_FALLBACK")
    used=$CLIENT_FALLBACK; modflag="-mod=mod"
  fi
  for b in $bins; do
    # shellcheck disable=SC2086
    (cd "$w" && go build $modflag -p "$JOBS" -trimpath -ldflags="-s -w" -o "$tmp/$b" "./cmd/$b")
  done
  printf 'operator %s\nslurm-client %s (pinned %s)\n' "$v" "$used" "$pinned" > "$tmp/BUILD-INFO"
  mkdir -p "$tmp/crds"
  cp "$w"/helm/slurm-operator-crds/templates/*.yaml "$tmp/crds/"
  "$tmp/manager" --help >/dev/null 2>&1 || { log "built manager $v does not run"; exit 1; }
  rm -rf "$dest"; mv "$tmp" "$dest"
  rm -rf "$w"
}

mkdir -p "$CACHE/bin" "$CACHE/build"
for v in $VERSIONS; do build "$v"; done
log "ok: slurm-operator $VERSIONS in $CACHE/bin"
