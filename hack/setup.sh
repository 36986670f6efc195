#!/usr/bin/env bash
# Sets up everything from nothing (idempotent, fast when already done):
#   - .venv with the operator, the quantizer's ML stack and the test tools (pip's cache keeps reruns quick);
#   - the control plane's binaries, built from the Go module proxy and cached under ~/.cache/rerank-operator;
#   - Prometheus from Debian (tests of the prometheus metrics source run a real server);
#   - the real node's parts from Debian (containerd, runc, CNI plugins, mmdebstrap, buildah) and its images: a Debian
#     rootfs with Python 3.11 (mmdebstrap) as the base, the operator's and the quantizer's images built from their
#     Dockerfiles by buildah, all cached under ~/.cache/rerank-operator by content.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[setup] %s\n' "$*" >&2; }

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
# The quantizer's stack is pinned to the quantizer image's lock (hack/lock_image_requirements.py): the suite tests
# exactly what the image ships.
locks="quantizer_job/image-requirements.txt quantizer_job/image-requirements-cuda.txt"
stamp=".venv/.installed-$(cat pyproject.toml $locks | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "installing Python dependencies (first time: torch and friends, several minutes)"
  .venv/bin/pip install --disable-pip-version-check -q -e ".[operator,quantizer,test]" \
    $(for f in $locks; do printf -- '-c %s ' "$f"; done)
  touch "$stamp"
fi

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
apt_install() {  # apt_install PACKAGE... : only what is missing; one apt-get update per run at most
  local missing=()
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]} from Debian"
  if [ -z "${APT_UPDATED:-}" ]; then $SUDO apt-get update -qq; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The real node (tests/cluster/test_real_node.py): containerd 1.6 + runc + CNI plugins run its pods; mmdebstrap
# makes its images' rootfs. Debian starts containerd as a service; the dev cluster runs its own instance.
had_containerd="$(command -v containerd || true)"
# buildah builds the operator's and the quantizer's images from their Dockerfiles (no daemon, no registry).
apt_install containerd runc containernetworking-plugins mmdebstrap buildah docker-registry
if [ -z "$had_containerd" ]; then  # only the service we just installed; a machine's own containerd stays as it was
  $SUDO systemctl disable --now containerd >/dev/null 2>&1 || $SUDO service containerd stop >/dev/null 2>&1 || true
fi

log "control plane binaries and the real node's images"
.venv/bin/python -m rerank_devcluster build

if ! command -v prometheus >/dev/null 2>&1; then
  log "installing prometheus from Debian"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # Debian starts it as a service; tests run their own instances.
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || $SUDO service prometheus stop >/dev/null 2>&1 || true
fi
log "ready"
