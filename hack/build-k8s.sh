#!/usr/bin/env bash
# Build the local control-plane binaries from the Go module proxy, once, into a
# cache keyed by version:
#   etcd, etcdctl               go.etcd.io/etcd  (server/v3, etcdctl/v3)
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl   k8s.io/kubernetes
#   kwok                        sigs.k8s.io/kwok
#   helm                        helm.sh/helm/v3
# A warm cache returns at once. Prints nothing but errors and a summary line.
#
# env: HEALER_CACHE (default ~/.cache/healer), KUBE_VERSION, ETCD_VERSION,
#      KWOK_VERSION, HELM_VERSION, ONLY="etcd kube kwok helm" (subset to build)
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${HEALER_CACHE:-$HOME/.cache/healer}
ONLY=${ONLY:-etcd kube kwok helm}

export GOTOOLCHAIN=local GOWORK=off GOFLAGS="-modcacherw -buildvcs=false" CGO_ENABLED=0
export GOPROXY=${GOPROXY:-https://proxy.golang.org}
JOBS=${GO_BUILD_JOBS:-2}

log() { printf '[build-k8s] %s\n' "$*" >&2; }

have() { # have DIR BIN... : every binary present and executable
  local d=$1; shift
  for b in "$@"; do [ -x "$d/$b" ] || return 1; done
}

# Files are built into a temporary directory and renamed into place, so an
# interrupted build never leaves a half-written cache entry behind.
finish() { # finish TMPDIR DEST
  rm -rf "$2"; mkdir -p "$(dirname "$2")"; mv "$1" "$2"
}

# temporary output directories of an interrupted or failed build are removed on exit
TMPS=()
cleanup() { for t in "${TMPS[@]}"; do rm -rf "$t"; done; }
trap cleanup EXIT
newtmp() { NEWTMP=$(mktemp -d "$CACHE/bin/.$1.XXXX"); TMPS+=("$NEWTMP"); }

build_etcd() {
  local dest=$CACHE/bin/etcd-$ETCD_VERSION
  have "$dest" etcd etcdctl && return 0
  log "building etcd $ETCD_VERSION (first run only)"
  local w=$CACHE/build/etcd-$ETCD_VERSION tmp
  rm -rf "$w"; mkdir -p "$w"; newtmp etcd; tmp=$NEWTMP
  (
    cd "$w"
    printf 'module etcd-build.local/wrapper\n\ngo 1.25.0\n' > go.mod
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION" >/dev/null 2>&1 \
      || go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION"
    go build -p "$JOBS" -trimpath -ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION" \
      -o "$tmp/etcd" go.etcd.io/etcd/server/v3
    go build -p "$JOBS" -trimpath -ldflags="-s -w" -o "$tmp/etcdctl" go.etcd.io/etcd/etcdctl/v3
  )
  "$tmp/etcd" --version >/dev/null
  finish "$tmp" "$dest"
}

build_kube() {
  local bins="kube-apiserver kube-controller-manager kube-scheduler kubectl"
  local dest=$CACHE/bin/kube-$KUBE_VERSION
  # shellcheck disable=SC2086
  have "$dest" $bins && return 0
  log "building kubernetes $KUBE_VERSION: $bins (first run only; several minutes)"
  local w=$CACHE/build/kube-$KUBE_VERSION tmp
  rm -rf "$w"; mkdir -p "$w"; newtmp kube; tmp=$NEWTMP
  (
    cd "$w"
    local minor rest sver json kmod commit gd mods pkgs ld d p
    minor=$(echo "$KUBE_VERSION" | cut -d. -f2); rest=$(echo "$KUBE_VERSION" | cut -d. -f3-)
    sver="v0.${minor}.${rest}"
    printf 'module kube-build.local/wrapper\n\ngo 1.24\n' > go.mod
    json=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION")
    kmod=$(printf '%s' "$json" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
    commit=$(printf '%s' "$json" | python3 -c 'import json,sys;print((json.load(sys.stdin).get("Origin") or {}).get("Hash",""))')
    go mod edit -go="$(awk '$1=="go"{print $2;exit}' "$kmod")"
    gd=$(awk '$1=="godebug"{print $2;exit}' "$kmod")
    [ -n "$gd" ] && go mod edit -godebug="$gd"
    # Every staging module is required at v0.0.0 upstream and replaced with a
    # local path; point each at its published tag instead.
    mods=$( { sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$kmod"
              sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\)[[:space:]][[:space:]]*v0\.0\.0\([[:space:]].*\)\{0,1\}$#\1#p' "$kmod"; } | sort -u )
    [ -n "$mods" ] || { log "no staging modules found in $kmod"; exit 1; }
    for m in $mods; do go mod edit -replace="$m=$m@$sver"; done
    go mod edit -require="k8s.io/kubernetes@$KUBE_VERSION"
    pkgs=""; for b in $bins; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
    # shellcheck disable=SC2046
    go get -tool $(for p in $pkgs; do printf '%s@%s ' "$p" "$KUBE_VERSION"; done)
    d=$(date -u +%Y-%m-%dT%H:%M:%SZ); ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$d"
      [ -n "$commit" ] && ld="$ld -X $p.gitCommit=$commit"
    done
    # shellcheck disable=SC2086
    go build -p "$JOBS" -trimpath -tags=selinux,notest -ldflags="$ld" -o "$tmp/" $pkgs
  )
  "$tmp/kube-apiserver" --version >/dev/null
  finish "$tmp" "$dest"
}

build_kwok() {
  local dest=$CACHE/bin/kwok-$KWOK_VERSION
  have "$dest" kwok && return 0
  log "building kwok $KWOK_VERSION (first run only)"
  local tmp; newtmp kwok; tmp=$NEWTMP
  GOBIN=$tmp go install -trimpath -ldflags="-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  finish "$tmp" "$dest"
}

build_helm() {
  local dest=$CACHE/bin/helm-$HELM_VERSION
  have "$dest" helm && return 0
  log "building helm $HELM_VERSION (first run only)"
  local tmp; newtmp helm; tmp=$NEWTMP
  GOBIN=$tmp go install -trimpath -ldflags="-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  finish "$tmp" "$dest"
}

mkdir -p "$CACHE/bin" "$CACHE/build"
for what in $ONLY; do "build_$what"; done
log "ok: $(for what in $ONLY; do printf '%s ' "$what"; done)in $CACHE/bin"
