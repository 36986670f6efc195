"""A release of rerank-operator pushed to a registry you name: both images, and the chart referencing them by digest.

    hack/release --version 0.1.0 --registry registry.example.com/platform [--insecure]
                 [--username USER --password-stdin] [--base IMAGE]

- Images: ``operator/Dockerfile`` and ``quantizer_job/Dockerfile`` built by buildah (:func:`images.build`, cached by
  content), pushed as ``<registry>/rerank-operator:<version>`` and ``<registry>/rerank-quantizer:<version>`` by the
  distribution API (:class:`registry.Client`: HTTPS, or plain HTTP with ``--insecure``; basic or token auth).
- Chart: ``charts/rerank-operator`` copied with its links followed (the CRDs and RBAC rules it links to), its values
  pointing at the pushed digests (``image.repository`` + ``image.digest``, ``workloads.quantizerImage``), packaged as
  ``<version>`` and pushed to ``oci://<registry>/charts/rerank-operator``.

Then ``helm install rerank oci://<registry>/charts/rerank-operator --version <version>`` runs exactly what was
pushed: nothing names a tag that could move. Prints JSON: the references pushed. The dev cluster's e2e test runs a
release into the cluster's own registry and installs it (tests/e2e, ``hack/demo``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rerank_devcluster import binaries, images, nodeimage, registry

CHART = binaries.REPO_ROOT / "charts" / "rerank-operator"
OPERATOR_REPOSITORY = nodeimage.OPERATOR_REPOSITORY
QUANTIZER_REPOSITORY = nodeimage.QUANTIZER_REPOSITORY
CHART_REPOSITORY = "charts"  # the chart goes to oci://<registry>/charts/rerank-operator


class ReleaseError(RuntimeError):
    """A step failed; the message says which, with the tool's output."""


@dataclass(frozen=True)
class Published:
    """What a release pushed: the images by digest, and helm's arguments for the chart."""

    version: str
    operator_image: str
    quantizer_image: str
    chart: str  # oci://<registry>/charts/rerank-operator
    chart_version: str

    def helm_args(self, insecure: bool = False) -> tuple[str, ...]:
        return (self.chart, "--version", self.chart_version, *(("--plain-http",) if insecure else ()))


def split_registry(target: str) -> tuple[str, str]:
    """``host[:port][/prefix]`` -> (host, prefix); refused when it is not a registry host."""
    host, _, prefix = target.strip("/").partition("/")
    if not re.fullmatch(r"[a-zA-Z0-9.-]+(:[0-9]+)?", host) or ("." not in host and ":" not in host \
            and host != "localhost"):
        raise ReleaseError(f"--registry {target!r}: expected host[:port][/path], e.g. registry.example.com/platform")
    return host, prefix


def chart_values(values: str, operator_image: str, quantizer_image: str) -> str:
    """The chart's values.yaml text with the pushed images in place of the defaults (comments kept)."""
    repository, _, digest = operator_image.partition("@")
    out, n = re.subn(r"(?m)^(image:\n(?:  .*\n|\s*\n)*?  repository: ).*$", rf"\g<1>{repository}", values, count=1)
    out, m = re.subn(r'(?m)^(image:\n(?:  .*\n|\s*\n)*?  digest: )"".*$', rf'\g<1>"{digest}"', out, count=1)
    out, k = re.subn(r'(?m)^(  quantizerImage: )"".*$', rf'\g<1>"{quantizer_image}"', out, count=1)
    if (n, m, k) != (1, 1, 1):
        raise ReleaseError("charts/rerank-operator/values.yaml no longer has image.repository, image.digest and "
                           "workloads.quantizerImage where the release writes them")
    return out


def _helm(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(binaries.ensure("helm")), *args], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise ReleaseError(f"helm {' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def push_chart(client: registry.Client, prefix: str, version: str, operator_image: str, quantizer_image: str,
               workdir: Path) -> tuple[str, str]:
    """Package the chart with the pushed images as its values and push it; returns (oci reference, version)."""
    copy = workdir / "rerank-operator"
    shutil.copytree(CHART, copy, symlinks=False)
    values = copy / "values.yaml"
    values.write_text(chart_values(values.read_text(), operator_image, quantizer_image))
    _helm("lint", "--strict", str(copy))
    out = _helm("package", str(copy), "--version", version, "--app-version", version, "--destination", str(workdir))
    archive = out.strip().rsplit(": ", 1)[-1]
    where = "/".join(p for p in (client.host, prefix, CHART_REPOSITORY) if p)
    flags = ["--plain-http"] if client.insecure else []
    if client.username is not None:
        flags += ["--username", client.username, "--password", client.password or ""]
    _helm("push", archive, f"oci://{where}", *flags)
    return f"oci://{where}/rerank-operator", version


def publish(client: registry.Client, prefix: str, version: str, *, base: str | None = None,
            workdir: Path | None = None) -> Published:
    """Build both images (cached), push them and the chart that names them by digest."""
    base = base or nodeimage.base_image()
    operator = images.build(nodeimage.OPERATOR_DOCKERFILE, nodeimage.OPERATOR_REPO, base=base)
    quantizer = images.build(nodeimage.QUANTIZER_DOCKERFILE, nodeimage.QUANTIZER_REPO, base=base,
                             build_args=images.quantizer_build_args())
    path = f"{prefix}/" if prefix else ""
    operator_ref = client.push_archive(operator.archive, f"{path}{OPERATOR_REPOSITORY}", version)
    quantizer_ref = client.push_archive(quantizer.archive, f"{path}{QUANTIZER_REPOSITORY}", version)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        chart, chart_version = push_chart(client, prefix, version, operator_ref, quantizer_ref, Path(tmp))
    return Published(version, operator_ref, quantizer_ref, chart, chart_version)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/release", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--version", required=True, help="the release's version: image tags and the chart's version")
    parser.add_argument("--registry", required=True, help="host[:port][/path] to push to")
    parser.add_argument("--insecure", action="store_true", help="plain HTTP (a local registry only)")
    parser.add_argument("--username", default=None)
    parser.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    parser.add_argument("--base", default=None,
                        help="the images' base (python:3.11-slim-bookworm in buildah's storage; default: the dev "
                             "cluster's local stand-in built by mmdebstrap)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?", args.version):
        parser.error(f"--version {args.version!r} is not a semantic version (helm needs one), e.g. 0.1.0")
    try:
        host, prefix = split_registry(args.registry)
        password = sys.stdin.readline().rstrip("\n") if args.password_stdin else None
        client = registry.Client(host, insecure=args.insecure, username=args.username, password=password)
        published = publish(client, prefix, args.version, base=args.base)
    except (ReleaseError, registry.RegistryError, images.ImageBuildError, OSError) as exc:
        print(f"hack/release: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(published), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
