"""Certificates and keys for the dev cluster, made with the openssl command line (always on Debian).

One CA signs the apiserver's serving certificate and an admin client certificate in group ``system:masters``;
a separate RSA key pair signs service-account tokens. Everything lives in the cluster's work directory and is
thrown away with it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca_crt: Path
    ca_key: Path
    serving_crt: Path
    serving_key: Path
    admin_crt: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(cwd: Path, name: str, subject: str, extensions: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "3650", "-extfile", f"{name}.ext", cwd=cwd)


def client_certificate(directory: Path, name: str, user: str, group: str) -> tuple[Path, Path]:
    """A client certificate signed by the cluster's CA (made by :func:`create` in ``directory``): the kubelet's
    ``system:node:<name>`` identity in ``system:nodes``, which the Node authorizer recognises."""
    _signed(directory, name, f"/O={group}/CN={user}", "extendedKeyUsage=clientAuth\n")
    return directory / f"{name}.crt", directory / f"{name}.key"


def create(directory: Path, extra_ips: list[str] | tuple[str, ...] = ()) -> Pki:
    """The CA and the certificates; ``extra_ips`` are more addresses the API server's certificate is valid for."""
    directory.mkdir(parents=True, exist_ok=True)
    sans = ",".join(["IP:127.0.0.1", "IP:10.0.0.1", *(f"IP:{ip}" for ip in extra_ips), "DNS:localhost",
                     "DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc"])
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "3650", "-subj", "/CN=rerank-devcluster-ca", cwd=directory)
    _signed(directory, "serving", "/CN=kube-apiserver",
            f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    _signed(directory, "admin", "/O=system:masters/CN=rerank-devcluster-admin", "extendedKeyUsage=clientAuth\n")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    d = directory
    return Pki(d / "ca.crt", d / "ca.key", d / "serving.crt", d / "serving.key", d / "admin.crt", d / "admin.key",
               d / "sa.key", d / "sa.pub")
