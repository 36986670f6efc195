"""The dev cluster's image builds (hack/rerank_devcluster/images.py): what decides a rebuild, what the build sees.

The builds themselves run in the node tier (tests/cluster/test_real_node.py), whose pods run the images."""

from __future__ import annotations

import ipaddress
import shutil
from pathlib import Path

import pytest

from rerank_devcluster import images, operator_release, realnode
from rerank_devcluster.binaries import REPO_ROOT

DOCKERFILE = REPO_ROOT / "quantizer_job" / "Dockerfile"


@pytest.fixture
def context(tmp_path: Path) -> Path:
    """A copy of the repository's build context (only what .dockerignore keeps), plus files it ignores."""
    root = tmp_path / "repo"
    for f in images.context_files():
        dest = root / f.relative_to(REPO_ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)
    shutil.copy(REPO_ROOT / ".dockerignore", root / ".dockerignore")
    (root / "docs").mkdir()
    (root / "docs" / "x.md").write_text("ignored")
    (root / "quantizer_job" / "__pycache__").mkdir(exist_ok=True)
    (root / "quantizer_job" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"ignored")
    return root


def test_context_is_what_the_dockerfiles_copy_and_nothing_of_a_checkouts_clutter() -> None:
    names = {str(f.relative_to(REPO_ROOT)) for f in images.context_files()}
    for needed in ("pyproject.toml", "README.md", "operator/rerank_operator/__init__.py", "quantizer_job/cli.py",
                   "quantizer_job/image-requirements.txt", "quality_guard/server.py"):
        assert needed in names
    assert not any(n.startswith((".venv/", "tests/", "docs/", "hack/")) or "__pycache__" in n for n in names)


def test_the_key_follows_the_context_and_the_recipe_only(context: Path) -> None:
    key = images.content_key(DOCKERFILE, "base:1", {"A": "1"}, context)
    (context / "docs" / "x.md").write_text("changed, but not sent to the build")
    (context / "quantizer_job" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"changed too")
    assert images.content_key(DOCKERFILE, "base:1", {"A": "1"}, context) == key
    assert images.content_key(DOCKERFILE, "base:2", {"A": "1"}, context) != key
    assert images.content_key(DOCKERFILE, "base:1", {"A": "2"}, context) != key
    (context / "quantizer_job" / "cli.py").write_text("# an edit the image must carry\n")
    assert images.content_key(DOCKERFILE, "base:1", {"A": "1"}, context) != key


def test_the_build_uses_this_machines_index_and_trust() -> None:
    conf = images.build_pip_conf({"index-url": "https://mirror.example/simple", "cert": "/etc/host-ca.pem"})
    assert "index-url = https://mirror.example/simple" in conf
    assert f"cert = {images.BUILD_CA}" in conf and "/etc/host-ca.pem" not in conf  # mounted at BUILD_CA
    assert f"cache-dir = {images.BUILD_PIP_CACHE}" in conf
    assert "index-url" not in images.build_pip_conf({}) and "cert" not in images.build_pip_conf({})
    args = images.quantizer_build_args({"index-url": "https://mirror.example/simple"})
    assert args == {"TORCH_INDEX_URL": "https://mirror.example/simple", "TORCH_CUDA_LIBS": "true"}
    assert images.quantizer_build_args({})["TORCH_INDEX_URL"] == images.DEFAULT_INDEX


def test_operator_release_values_put_the_pod_on_the_real_node_and_point_it_at_the_api_server() -> None:
    vals = operator_release.values(image="rerank.local/operator:abc123", api_host="10.88.7.1", api_port=6443,
                                   watch_namespaces=["a"], replicas=1, extra={"tenantRoles": {"enabled": False}})
    assert vals["image"] == {"repository": "rerank.local/operator", "tag": "abc123", "pullPolicy": "IfNotPresent"}
    digest = "sha256:" + "ab" * 32
    by_digest = operator_release.values(image=f"127.0.0.1:5000/rerank/operator@{digest}", api_host="10.88.7.1",
                                        api_port=6443, watch_namespaces=[], replicas=1)
    assert by_digest["image"] == {"repository": "127.0.0.1:5000/rerank/operator", "digest": digest,
                                  "pullPolicy": "IfNotPresent"}
    assert vals["nodeSelector"] == realnode.node_selector() and vals["tolerations"] == [realnode.toleration()]
    assert {"name": "KUBERNETES_SERVICE_HOST", "value": "10.88.7.1"} in vals["extraEnv"]
    assert {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"} in vals["extraEnv"]
    assert vals["watchNamespaces"] == ["a"] and vals["tenantRoles"] == {"enabled": False}


def test_the_node_gateway_is_in_its_subnet() -> None:
    assert realnode.subnet("00000a") == "10.88.10.0/24" and realnode.gateway("00000a") == "10.88.10.1"


def test_a_node_subnet_already_routed_here_is_not_taken_again() -> None:
    """A bridge left by a killed cluster with the node's /24 would take its traffic ("no route to host")."""
    routed = realnode.parse_routes(
        "default via 192.0.2.1 dev eth0\n"
        "10.88.10.0/24 dev rrk00000a proto kernel scope link src 10.88.10.1 linkdown\n"
        "blackhole 10.88.11.0/24\n"
        "10.0.0.0/8 via 192.0.2.1 dev eth0\n")
    assert [str(n) for n in routed] == ["10.88.10.0/24", "10.88.11.0/24", "10.0.0.0/8"]
    assert not realnode.subnet_is_free("00000a", routed) and not realnode.subnet_is_free("00000b", routed)
    # A broader route (the host's 10/8) does not stop the bridge's /24: the more specific route wins.
    assert realnode.subnet_is_free("00000c", routed)
    taken = [ipaddress.IPv4Network(f"10.88.{i}.0/24") for i in range(250) if i != 42]
    assert realnode.subnet(realnode.new_tag(taken)) == "10.88.42.0/24"
    with pytest.raises(realnode.RealNodeError, match="every pod subnet"):
        realnode.new_tag([*taken, ipaddress.IPv4Network("10.88.42.0/25")])  # a narrower route claims it too


def test_the_real_nodes_sockets_fit_a_unix_socket_path_whatever_the_cluster_workdir() -> None:
    """The kubelet listens on ``<root-dir>/pod-resources/<10 digits>``; sun_path holds 107 bytes. Under pytest's
    ``pytest-NNN`` work directories the old root (``<workdir>/node``) passed 107 and the kubelet exited."""
    root = realnode.node_root("abcdef")
    deepest = root / "kubelet" / "pod-resources" / "3733841421"
    assert len(str(deepest).encode()) <= 107
    assert realnode.node_root("abcdef") == root and realnode.node_root("123456") != root
