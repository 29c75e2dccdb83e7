#!/usr/bin/env bash
# Install the Debian packages the real-stack tests and the demo start on loopback: Slurm
# (slurmctld, slurmd, slurmrestd + its JWT plugin, munge) and Prometheus (+ promtool); and what
# `make image` builds and inspects the image with, without a container engine: mmdebstrap (a root
# filesystem from Debian packages; it also builds the Slurm 24.11 and 26.05 roots,
# hack/build-slurm-roots.sh, which fetches the suites' Release files with curl) and skopeo (reads
# the OCI layout in tests/integration/test_image.py).
# Idempotent: does nothing when they are present. Never installs slurm-wlm-emulator (it hijacks
# /usr/sbin/slurmd through update-alternatives).
set -euo pipefail
PKGS=(slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin munge prometheus mmdebstrap skopeo curl)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "[install-system-deps] installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for p in slurmctld slurmd slurmstepd; do   # undo a stray emulator install, if any
  if [ -e "/usr/sbin/$p-wlm" ]; then $SUDO update-alternatives --set "$p" "/usr/sbin/$p-wlm" >/dev/null 2>&1 || true; fi
done
echo "[install-system-deps] ok" >&2
