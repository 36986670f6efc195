"""A real, local Kubernetes control plane for tests, demos and development.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake nodes and kubelets), built from the
Go module proxy by ``hack/build-binaries.sh`` and started as plain processes on 127.0.0.1 with free ports; a real
node (kubelet + containerd) where a test needs pods to run; a real Gateway API implementation, Traefik
(:mod:`rerank_devcluster.gateway`), where a test sends requests through the routes the operator writes.
No Docker, no internet. See :class:`rerank_devcluster.cluster.Cluster`.
"""

from rerank_devcluster.cluster import Cluster, ClusterError

__all__ = ["Cluster", "ClusterError"]
