"""Find the control plane's binaries: a directory named by ``RERANK_BIN_DIR``, then PATH, then the build cache.

Users with internet can bring official binaries (put them in ``RERANK_BIN_DIR`` or on PATH); everyone else gets
them built from the Go module proxy, pinned, by ``hack/build-binaries.sh`` and cached by version under
``~/.cache/rerank-operator``. The versions below are the single source; the build script reads them from the
environment this module passes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

K8S_VERSION = "1.34.4"
ETCD_VERSION = "3.6.5"
KWOK_VERSION = "0.7.0"
HELM_VERSION = "3.19.0"
TRAEFIK_VERSION = "3.7.13"
# Traefik 3.7 lists TLSRoute v1 (standard channel since Gateway API v1.5); against v1.4's CRDs it retries that list
# forever and never programs a Gateway.
GATEWAY_API_VERSION = "1.5.1"

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-binaries.sh"

#: binary name -> (cache sub-directory, build-script component)
_LOCATIONS = {
    "kube-apiserver": (f"kubernetes-v{K8S_VERSION}", "kubernetes"),
    "kube-controller-manager": (f"kubernetes-v{K8S_VERSION}", "kubernetes"),
    "kube-scheduler": (f"kubernetes-v{K8S_VERSION}", "kubernetes"),
    "kubectl": (f"kubernetes-v{K8S_VERSION}", "kubernetes"),
    "kubelet": (f"kubernetes-v{K8S_VERSION}", "kubelet"),
    "etcd": (f"etcd-v{ETCD_VERSION}", "etcd"),
    "kwok": (f"kwok-v{KWOK_VERSION}", "kwok"),
    "helm": (f"helm-v{HELM_VERSION}", "helm"),
    "traefik": (f"traefik-v{TRAEFIK_VERSION}", "traefik"),
}


def cache_dir() -> Path:
    return Path(os.environ.get("RERANK_CACHE", Path.home() / ".cache" / "rerank-operator"))


def build_env() -> dict[str, str]:
    """Environment for the build script, carrying the pinned versions."""
    return {
        **os.environ,
        "K8S_VERSION": K8S_VERSION,
        "ETCD_VERSION": ETCD_VERSION,
        "KWOK_VERSION": KWOK_VERSION,
        "HELM_VERSION": HELM_VERSION,
        "TRAEFIK_VERSION": TRAEFIK_VERSION,
        "RERANK_CACHE": str(cache_dir()),
    }


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every binary the dev cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kubelet: Path
    kwok: Path
    helm: Path
    #: the dev cluster's Gateway API implementation (rerank_devcluster.gateway)
    traefik: Path

    def path_dirs(self) -> list[str]:
        """Directories to put first on PATH so child tools (helm, kubectl) find the same binaries."""
        return sorted({str(p.parent) for p in vars(self).values()})


def _kubectl_on_path_is_usable(path: str) -> bool:
    """kubectl supports one minor version of skew; the Debian/CI kubectl may be older than that."""
    try:
        out = subprocess.run([path, "version", "--client", "-o", "json"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    m = re.search(r'"minor":\s*"(\d+)', out)
    want = int(K8S_VERSION.split(".")[1])
    return m is not None and abs(int(m.group(1)) - want) <= 1


def find(name: str) -> Path | None:
    """Where ``name`` already is, without building anything."""
    env_dir = os.environ.get("RERANK_BIN_DIR")
    if env_dir and (Path(env_dir) / name).is_file():
        return Path(env_dir) / name
    on_path = shutil.which(name)
    if on_path and (name != "kubectl" or _kubectl_on_path_is_usable(on_path)):
        return Path(on_path)
    cached = cache_dir() / _LOCATIONS[name][0] / name
    return cached if cached.is_file() else None


def ensure(name: str) -> Path:
    """Path of ``name``, building it from the Go module proxy first if it is nowhere to be found."""
    found = find(name)
    if found:
        return found
    component = _LOCATIONS[name][1]
    subprocess.run(["bash", str(BUILD_SCRIPT), component], check=True, env=build_env())
    found = find(name)
    if not found:
        raise FileNotFoundError(f"{name} not found after building {component} (see {BUILD_SCRIPT})")
    return found


def ensure_all() -> Binaries:
    missing = [n for n in _LOCATIONS if find(n) is None]
    if missing:
        subprocess.run(["bash", str(BUILD_SCRIPT), "all"], check=True, env=build_env())
    return Binaries(**{n.replace("-", "_"): ensure(n) for n in _LOCATIONS})


def gateway_api_crds() -> list[Path]:
    """The Gateway API standard-channel CRDs, taken from the Go module zip (cached by version)."""
    target = cache_dir() / f"gateway-api-v{GATEWAY_API_VERSION}"
    if not target.is_dir():
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"sigs.k8s.io/gateway-api@v{GATEWAY_API_VERSION}"],
            check=True, capture_output=True, text=True, cwd="/", env={**os.environ, "GOFLAGS": "-mod=mod"},
        ).stdout
        src = Path(json.loads(out)["Dir"]) / "config" / "crd" / "standard"
        tmp = target.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        for f in tmp.rglob("*"):
            f.chmod(0o755 if f.is_dir() else 0o644)
        tmp.rename(target)
    return sorted(p for p in target.glob("*.yaml") if "kustomization" not in p.name)
