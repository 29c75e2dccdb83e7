#!/usr/bin/env bash
# Build the Debian root filesystems the local stack runs the newer Slurms from, with mmdebstrap:
#   sid    -> Slurm 26.05 (slurmrestd data parsers v0.0.42 .. v0.0.45), what Slinky 1.x needs
#   trixie -> Slurm 24.11 (slurmrestd v0.0.40 .. v0.0.42)
# (the host's own Debian 12 packages give Slurm 22.05: hack/install-system-deps.sh).
#
# Each root lands in $HEALER_CACHE/slurm-root/<suite>-<key>/ where <key> hashes the suite's
# Release file (as the mirror serves it now), the package list and this recipe: a root is
# rebuilt only when one of them changes. $HEALER_CACHE/slurm-root/<suite> is a symlink to the
# current one; older ones are removed after a successful build. When the mirror cannot be
# reached, the current root is kept and used (said on stderr). The path of each root is
# printed on stdout, one line per suite, as "<suite> <path>".
#
# The daemons run from a root by chroot in a private mount namespace (ADR 0017,
# healer_dev/devstack/slurm_root.py); the build prepares what that needs: an empty /etc/hosts
# to bind the host's over, and the marker file /.healer-slurm-root (suite, Slurm version, key).
#
# env: HEALER_CACHE (default ~/.cache/healer), SLURM_ROOTS (default "sid trixie"),
#      HEALER_DEBIAN_MIRROR (default: the first Debian mirror in this machine's apt sources,
#      else http://deb.debian.org/debian). Needs root (mmdebstrap --mode=root) and curl.
set -euo pipefail

CACHE=${HEALER_CACHE:-$HOME/.cache/healer}
SUITES=${SLURM_ROOTS:-sid trixie}
RECIPE=1  # bump when the steps below change what a root contains
PACKAGES="slurmctld,slurmd,slurmrestd,slurm-client,slurm-wlm-jwt-plugin,munge,ca-certificates"
BASE=$CACHE/slurm-root

log() { printf '[build-slurm-roots] %s\n' "$*" >&2; }

mirror() {
  if [ -n "${HEALER_DEBIAN_MIRROR:-}" ]; then echo "${HEALER_DEBIAN_MIRROR%/}"; return; fi
  local m=""
  # deb822 sources (URIs: ...) first, then one-line sources (deb URL suite ...)
  m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
      /^URIs:/ { uri=$2 } /^Suites:/ { if (uri ~ /\/debian\/?$/) { print uri; exit } }') || true
  if [ -z "$m" ]; then
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '
        $1=="deb" { for (i=2;i<=NF;i++) if ($i ~ /^https?:/) { if ($i ~ /\/debian\/?$/) { print $i; exit } ; break } }') || true
  fi
  echo "${m:-http://deb.debian.org/debian}" | sed 's:/*$::'
}

build() { # build SUITE MIRROR
  local suite=$1 mir=$2 release key dir tmp current version t0
  current=$BASE/$suite
  if ! release=$(curl -fsSL --retry 2 --max-time 60 "$mir/dists/$suite/Release"); then
    if [ -f "$current/.healer-slurm-root" ]; then
      log "cannot fetch $mir/dists/$suite/Release: keeping the current $suite root"
      echo "$suite $(readlink -f "$current")"
      return 0
    fi
    log "cannot fetch $mir/dists/$suite/Release and no $suite root is cached"
    return 1
  fi
  key=$( { printf '%s\n' "$release"; echo "$PACKAGES"; echo "recipe $RECIPE"; } \
         | sha256sum | cut -c1-16)
  dir=$BASE/$suite-$key
  if [ -f "$dir/.healer-slurm-root" ]; then
    ln -sfn "$suite-$key" "$current"
    echo "$suite $dir"
    return 0
  fi
  log "building the $suite root ($PACKAGES) from $mir (first run, or the archive changed)"
  t0=$(date +%s)
  tmp=$(mktemp -d "$BASE/.$suite-$key.XXXX")
  rmdir "$tmp"
  # the archive served here is a frozen snapshot: its Release files are past Valid-Until
  mmdebstrap --quiet --mode=root --variant=essential \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --include="$PACKAGES" \
    --customize-hook='touch "$1/etc/hosts"' \
    "$suite" "$tmp" "$mir" >&2
  version=$(chroot "$tmp" /usr/sbin/slurmctld -V | awk '{print $2}')
  [ -n "$version" ] || { log "the $suite root has no working slurmctld"; rm -rf "$tmp"; return 1; }
  printf 'suite=%s\nslurm=%s\nkey=%s\nmirror=%s\nbuilt_seconds=%s\n' "$suite" "$version" "$key" \
    "$mir" "$(( $(date +%s) - t0 ))" > "$tmp/.healer-slurm-root"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  ln -sfn "$suite-$key" "$current"
  for old in "$BASE/$suite"-*; do  # roots of an older Release or recipe
    [ "$old" = "$dir" ] || rm -rf "$old"
  done
  log "ok: $suite root with Slurm $version in $dir ($(( $(date +%s) - t0 )) s)"
  echo "$suite $dir"
}

[ "$(id -u)" -eq 0 ] || { log "mmdebstrap --mode=root needs root"; exit 1; }
command -v mmdebstrap >/dev/null || { log "mmdebstrap is missing: run hack/install-system-deps.sh"; exit 1; }
mkdir -p "$BASE"
exec 9> "$BASE/.lock"
flock 9  # one build at a time on this machine (worktrees share the cache)
MIRROR=$(mirror)
for s in $SUITES; do
  case $s in sid|trixie) ;; *) log "unknown suite $s (sid: Slurm 26.05, trixie: Slurm 24.11)"; exit 2 ;; esac
  build "$s" "$MIRROR"
done
