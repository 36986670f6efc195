#!/usr/bin/env bash
# Sets up everything from nothing (idempotent, fast when already done):
#   - .venv with the operator, the quantizer's ML stack and the test tools (pip's cache keeps reruns quick);
#   - the control plane's binaries, built from the Go module proxy and cached under ~/.cache/rerank-operator;
#   - Prometheus from Debian (tests of the prometheus metrics source run a real server).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[setup] %s\n' "$*" >&2; }

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "installing Python dependencies (first time: torch and friends, several minutes)"
  .venv/bin/pip install --disable-pip-version-check -q -e ".[operator,quantizer,test]"
  touch "$stamp"
fi

log "control plane binaries"
.venv/bin/python -m rerank_devcluster build

if ! command -v prometheus >/dev/null 2>&1; then
  log "installing prometheus from Debian"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # Debian starts it as a service; tests run their own instances.
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || $SUDO service prometheus stop >/dev/null 2>&1 || true
fi
log "ready"
