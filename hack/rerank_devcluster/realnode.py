"""A real worker node next to the kwok nodes: containerd + runc + CNI bridge + the kubelet, as local processes.

Pods scheduled here really run: own namespaces and cgroups (cgroup v1 on these machines), the uid the pod asks
for, a read-only root filesystem, volumes mounted by the kubelet, termination messages and exit codes reported
by the kubelet, memory limits enforced by the kernel (``OOMKilled``), ``activeDeadlineSeconds`` ending pods.

The node is tainted ``rerank.io/real-node=true:NoSchedule`` and labelled ``rerank.io/real-node=true``: ordinary
test pods keep landing on kwok nodes; a test asks for the real node with a toleration and a nodeSelector.

Everything lives under ``/tmp/rerank-node-<tag>`` (containerd's root and state, the kubelet's root dir, pod logs;
linked from ``<cluster workdir>/node``: unix sockets need a short path, :func:`node_root`);
each component logs to ``<cluster workdir>/logs/{containerd,kubelet}.log``. Stopping kills what still runs in the
node's containerd, unmounts what the kubelet and containerd mounted there and removes the node's cgroups and
bridge, so nothing outlives the cluster.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import json
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rerank_devcluster import nodeimage, pki, registry
from rerank_devcluster.processes import Processes, free_port
from rerank_devcluster.waiting import eventually

NAME = "real-0"
LABEL = "rerank.io/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
CGROUP_V1 = Path("/sys/fs/cgroup")
ROUTE_TYPES = frozenset({"unicast", "blackhole", "unreachable", "prohibit", "throw", "local", "broadcast",
                         "multicast", "nat", "anycast"})


def toleration() -> dict[str, str]:
    """What a pod needs to be allowed on the real node."""
    return {"key": LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def node_selector() -> dict[str, str]:
    """What a pod needs to be placed on the real node (and nowhere else)."""
    return {LABEL: "true"}


def subnet(tag: str) -> str:
    """The node's pod subnet, from its tag (several dev clusters may share the machine)."""
    return f"10.88.{int(tag, 16) % 250}.0/24"


def routed_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 destinations this machine already routes (``ip -4 route``; ``default`` left out)."""
    done = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, check=False)
    return parse_routes(done.stdout)


def parse_routes(text: str) -> list[ipaddress.IPv4Network]:
    """The destinations in ``ip -4 route`` output."""
    nets = []
    for line in text.splitlines():
        words = line.split()
        # "10.88.7.0/24 dev ...", or a route type first: "blackhole 10.0.0.0/8", "unreachable 10.1.2.0/24"
        dest = words[1] if words and words[0] in ROUTE_TYPES and len(words) > 1 else (words or ["default"])[0]
        with contextlib.suppress(ValueError):
            if dest != "default":
                nets.append(ipaddress.IPv4Network(dest, strict=False))
    return nets


def subnet_is_free(tag: str, routed: list[ipaddress.IPv4Network]) -> bool:
    """Whether no route as specific as the node's /24 (or more) already covers any of it. A bridge left by a killed
    cluster, or another cluster's, with the same /24 takes the node's traffic (the kernel routes by the older
    entry): the kubelet's probes then fail with "no route to host" and the pods cannot reach the API server."""
    mine = ipaddress.IPv4Network(subnet(tag))
    return not any(net.overlaps(mine) and net.prefixlen >= mine.prefixlen for net in routed)


def new_tag(routed: list[ipaddress.IPv4Network] | None = None) -> str:
    """A fresh node tag (bridge name, node directory, pod subnet) whose subnet this machine does not route yet."""
    taken = routed_networks() if routed is None else routed
    start = secrets.randbelow(0xFFFF00)  # random, so clusters started together rarely collide; + k stays 6 digits
    for k in range(250):  # (start + k) % 250 visits every subnet once
        tag = f"{start + k:06x}"
        if subnet_is_free(tag, taken):
            return tag
    raise RealNodeError(f"every pod subnet in 10.88.0.0/16 is routed on this machine already: {taken}")


def network_report(address: str) -> str:
    """How this machine routes a pod's address, and its bridges: what a probe's "no route to host" needs."""
    route = subprocess.run(["ip", "route", "get", address], capture_output=True, text=True, check=False)
    bridges = subprocess.run(["ip", "-br", "addr", "show", "type", "bridge"], capture_output=True, text=True,
                             check=False)
    return f"ip route get {address}: {(route.stdout or route.stderr).strip()}\nbridges:\n{bridges.stdout.strip()}"


def gateway(tag: str) -> str:
    """The bridge's own address in :func:`subnet` (host-local's gateway, the first address): the host, seen
    from the node's pods."""
    return subnet(tag).replace(".0/24", ".1")


def quantizer_placement_policy(namespace_label: str) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy (and binding): quantizer and quality-guard pods (both from the quantizer image) in
    namespaces labelled ``namespace_label=true`` get the real node's nodeSelector and toleration at admission, so the
    operator's pod spec stays its own while the TEI pools stay on kwok nodes (there is no TEI image here)."""
    name = "rerank-quantizer-on-real-node"
    selector = json.dumps(node_selector())
    tol = json.dumps(toleration())
    # JSONPatch, not ApplyConfiguration: nodeSelector and tolerations are atomic, which apply may not mutate.
    expression = (
        f"[JSONPatch{{op: 'add', path: '/spec/nodeSelector', value: {selector}}}, "
        f"has(object.spec.tolerations) ? JSONPatch{{op: 'add', path: '/spec/tolerations/-', value: {tol}}} "
        f": JSONPatch{{op: 'add', path: '/spec/tolerations', value: [{tol}]}}]"
    )
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {
             "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                     "operations": ["CREATE"], "resources": ["pods"]}]},
             "matchConditions": [{"name": "quantizer-image", "expression":
                                  "has(object.metadata.labels) && "
                                  "object.metadata.labels[?'app.kubernetes.io/component'].orValue('') "
                                  "in ['quantizer', 'quality-guard']"}],
             "failurePolicy": "Fail", "reinvocationPolicy": "Never",
             "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {"policyName": name,
                  "matchResources": {"namespaceSelector": {"matchLabels": {namespace_label: "true"}}}}},
    ]


def local_pv(name: str, storage_class: str, path: Path, nodes: list[str]) -> dict[str, Any]:
    """A local PersistentVolume. Every node of the dev cluster is this machine, so the directory is on all of
    them: the real node mounts it for the quantizer (the kubelet applies the pod's fsGroup to it), kwok's pools
    "mount" it too."""
    return {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "20Gi"}, "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                 "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Retain",
                 "volumeMode": "Filesystem", "local": {"path": str(path)},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}},
    }


def node_root(tag: str, tmp: Path = Path("/tmp")) -> Path:
    """The node's own directory: short and fixed by its tag, whatever the cluster's work directory is. The kubelet
    and containerd listen on unix sockets under it (``kubelet/pod-resources/<n>``, ``containerd.sock``) and a
    socket's path must fit in 107 bytes: under pytest's ``/tmp/pytest-of-root/pytest-NNN/<test name>/cluster`` it did
    not once pytest's counter reached three digits ("bind: invalid argument")."""
    return tmp / f"rerank-node-{tag}"


class RealNodeError(RuntimeError):
    """The real node could not start; the message says which part and why."""


def containerd_config(root: Path, sock: Path, cni_conf_dir: Path, cni_bin_dir: str, sandbox_image: str,
                      registry_hosts: Path) -> str:
    """containerd 1.6's config (version 2): own root, state and socket, the CRI plugin with runc (cgroupfs), the
    registries' host configuration under ``registry_hosts`` (the dev cluster's registry is plain HTTP)."""
    return f"""version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  stream_server_address = "127.0.0.1"
  # Never below containerd's own oom_score_adj: these machines deny CAP_SYS_RESOURCE even to root, so the -998
  # the CRI plugin asks for a sandbox fails in runc ("failed to update /proc/self/oom_score_adj").
  restrict_oom_score_adj = true
  # Pod network namespaces under the node's own state dir (not /run/netns), so teardown finds and removes them.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin_dir}"
    conf_dir = "{cni_conf_dir}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{registry_hosts}"
"""


def cni_config(bridge: str, subnet: str, ipam_dir: Path) -> dict[str, Any]:
    """A bridge network with host-local addresses: enough for pods to have a network namespace and an IP."""
    return {"cniVersion": "0.4.0", "name": "rerank-dev", "plugins": [
        {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(ipam_dir)}},
        {"type": "loopback"},
    ]}


def kubelet_config(*, root: Path, ca: Path, port: int, healthz_port: int, runtime_sock: Path,
                   cgroup_root: str, pod_logs: Path) -> dict[str, Any]:
    """The KubeletConfiguration: cgroupfs on cgroup v1 (``failCgroupV1: false``, the 1.34 default, stated),
    x509 client auth from the cluster CA, webhook authorization, eviction thresholds that a busy CI disk
    does not trip, and everything under the node's own directories."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root, "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": f"unix://{runtime_sock}",
        "address": "0.0.0.0", "port": port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "registerNode": True,
        "registerWithTaints": [TAINT],
        "failSwapOn": False,
        "oomScoreAdj": 0,  # the default -999 needs CAP_SYS_RESOURCE, which root lacks on these machines
        "makeIPTablesUtilChains": False,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        # Absolute, small: a percentage of a shared 250 GB disk is gigabytes that other work on the machine may
        # hold, and a pod evicted for DiskPressure there fails a test for a reason that is not the test's.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "256Mi", "imagefs.available": "256Mi",
                         "nodefs.inodesFree": "1%"},
        "podLogsDir": str(pod_logs),
        "staticPodPath": "",
        "resolvConf": "/etc/resolv.conf",
        "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "20s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "maxPods": 20,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "localStorageCapacityIsolation": True,
    }


@dataclass
class RealNode:
    """The real node's processes belong to the cluster (its ``processes``, passed in); this object knows its paths.

    It knows of the cluster only what it is given: the work directory (the cluster CA under ``pki/``), the API
    server's URL and the kubelet binary. Whether the node is Ready is the cluster's question to its API server.
    """

    processes: Processes
    root: Path
    pki_dir: Path
    server: str
    kubelet: Path
    cgroup_root: str
    bridge: str
    images: nodeimage.NodeImages
    registry: registry.LocalRegistry | None = None
    chart: tuple[str, ...] | None = None  # helm's arguments for the chart pushed to the registry (operator_release)

    @property
    def sock(self) -> Path:
        return self.root / "containerd.sock"

    # -- start -----------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, processes: Processes, *, tag: str, workdir: Path, server: str, kubelet: Path) -> RealNode:
        """The node's paths and images (built or taken from the cache); nothing runs yet."""
        images = nodeimage.ensure_images()
        for abandoned in reap_abandoned():
            print(f"removed {abandoned}: a real node that no process uses (a run killed before its teardown)",
                  file=sys.stderr)
        root = node_root(tag)
        link = workdir / "node"  # where the cluster's other files are: a link to the short root
        link.unlink(missing_ok=True)
        link.symlink_to(root, target_is_directory=True)
        return cls(processes=processes, root=root, pki_dir=workdir / "pki", server=server,
                   kubelet=kubelet, cgroup_root=f"/rerank-{tag}", bridge=f"rrk{tag}", images=images)

    def start(self, deadline: float) -> None:
        """The registry, the images pushed to it, containerd, then the kubelet. Pods name the images by their
        digest in the registry (``self.images`` after this), and containerd pulls them as any node would."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.registry = registry.LocalRegistry(self.processes, self.root / "registry").start(deadline)
        self.images = self.images.pushed(self.registry)
        self._start_containerd(deadline)
        self._start_kubelet(free_port(), free_port())

    def _ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str(self.sock), "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, check=check, timeout=timeout)

    def _start_containerd(self, deadline: float) -> None:
        cni_bin = next((d for d in CNI_BIN_DIRS if Path(d, "bridge").is_file()), None)
        if cni_bin is None:
            raise RealNodeError(f"no CNI plugins in {CNI_BIN_DIRS} "
                                "(Debian: apt-get install containernetworking-plugins)")
        net_d = self.root / "net.d"
        net_d.mkdir(exist_ok=True)
        (net_d / "10-rerank-dev.conflist").write_text(json.dumps(cni_config(self.bridge, subnet(self.bridge[3:]),
                                                                            self.root / "ipam")))
        hosts = self.root / "certs.d"
        assert self.registry is not None
        (hosts / self.registry.host).mkdir(parents=True, exist_ok=True)
        (hosts / self.registry.host / "hosts.toml").write_text(registry.hosts_toml(self.registry.host))
        config = self.root / "containerd.toml"
        config.write_text(containerd_config(self.root / "containerd", self.sock, net_d, cni_bin,
                                            self.images.pause_image, hosts))
        self.processes.spawn("containerd", ["containerd", "--config", str(config)])
        self.processes.wait_for(lambda: self.sock.exists() and self._ctr("version", check=False).returncode == 0,
                                deadline, "containerd's socket")

    def image_refs(self) -> list[str]:
        """Every image reference containerd holds for the kubelet (``ctr images ls``): what it pulled."""
        return self._ctr("images", "ls", "-q").stdout.split()

    def push_image(self, archive: Path, repository: str, tag: str) -> str:
        """Push another image (e.g. a benchmark's TEI image) to the node's registry; returns its digest reference."""
        assert self.registry is not None, "the node is not started"
        return self.registry.push_archive(archive, repository, tag)

    def _start_kubelet(self, port: int, healthz_port: int) -> None:
        certs = self.pki_dir
        crt, key = pki.client_certificate(certs, "node", f"system:node:{NAME}", "system:nodes")
        kubeconfig = self.root / "kubelet.kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "dev", "cluster": {"server": self.server,
                                                     "certificate-authority": str(certs / "ca.crt")}}],
            "users": [{"name": NAME, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "dev", "user": NAME}}],
        }))
        for controller in _cgroup_controllers():
            (CGROUP_V1 / controller / self.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        pod_logs = self.root / "pod-logs"
        pod_logs.mkdir(exist_ok=True)
        config = self.root / "kubelet.yaml"
        config.write_text(json.dumps(kubelet_config(
            root=self.root, ca=certs / "ca.crt", port=port, healthz_port=healthz_port, runtime_sock=self.sock,
            cgroup_root=self.cgroup_root, pod_logs=pod_logs), indent=1))
        self.processes.spawn("kubelet", [
            str(self.kubelet), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.root / 'kubelet'}", f"--cert-dir={self.root / 'kubelet-pki'}",
            f"--hostname-override={NAME}", f"--node-labels={LABEL}=true,type=real",
            "--v=2",
        ])

    # -- stop ------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Before the control plane stops: the kubelet (so it restarts nothing), then its containers, then
        containerd. :meth:`teardown` follows once every process has stopped."""
        self.processes.stop("kubelet")
        self.cleanup()
        self.processes.stop("containerd")

    def cleanup(self) -> None:
        """After the kubelet has stopped, before containerd stops: end every container of the node."""
        if not self.sock.exists():
            return
        tasks = self._ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self._ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        for task in tasks:
            # Deleting a killed task succeeds once it has exited; best effort, a few seconds each.
            with contextlib.suppress(RealNodeError):
                eventually(functools.partial(self._delete_task, task), timeout=4,
                           what=f"containerd task {task} to be deleted", every=0.2, error=RealNodeError)
        for container in self._ctr("containers", "ls", "-q", check=False).stdout.split():
            self._ctr("containers", "delete", container, check=False)

    def _delete_task(self, task: str) -> bool:
        return self._ctr("tasks", "delete", task, check=False).returncode == 0

    def teardown(self) -> None:
        """After containerd has stopped: mounts, network namespaces, the bridge and the cgroups."""
        _unmount_under(self.root)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        # containerd's images, unpacked (~8 GB with the quantizer's): worthless once it has stopped, even where the
        # cluster's work directory is kept (the demo keeps its logs).
        shutil.rmtree(self.root / "containerd", ignore_errors=True)

    def remove(self) -> None:
        """After :meth:`teardown`, when the cluster's work directory goes too: the node's directory."""
        shutil.rmtree(self.root, ignore_errors=True)
        _remove_cgroups(self.cgroup_root)


def reap_abandoned(tmp: Path = Path("/tmp"), *, min_age_s: float = 600) -> list[Path]:
    """Remove the node directories that no running process uses, with their mounts, bridge and cgroups.

    A run killed before its teardown (a CI job's time limit, a session's end, SIGKILL) leaves its node behind:
    ~8 GB of unpacked images and the overlay mounts that pin them. Left to pile up they filled this machine's
    disk until the next run's kubelet reported DiskPressure and evicted the test's own pods. A node is in use
    while a process names its directory (containerd's and the kubelet's ``--config``, every shim's
    ``-address``); a directory younger than ``min_age_s`` may be a run that is starting up, and is left alone.
    """
    live = _command_lines()
    reaped = []
    for root in sorted(tmp.glob("rerank-node-*")):
        if not root.is_dir() or root.is_symlink() or any(str(root) in line for line in live):
            continue
        with contextlib.suppress(OSError):
            if time.time() - root.stat().st_mtime < min_age_s:
                continue
        tag = root.name.removeprefix("rerank-node-")
        _unmount_under(root)
        subprocess.run(["ip", "link", "delete", f"rrk{tag}"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        _remove_cgroups(f"/rerank-{tag}")
        reaped.append(root)
    return reaped


def _command_lines() -> list[str]:
    """Every running process's command line, arguments joined by spaces (processes that end meanwhile skipped)."""
    lines = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return lines


def _unmount_under(root: Path) -> None:
    """Lazily unmount everything mounted under ``root``, deepest first (overlay rootfs, shm, netns, volumes)."""
    for mount in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True)


def _remove_cgroups(cgroup_root: str) -> None:
    """The node's cgroups in every v1 hierarchy, leaves first."""
    for controller in _cgroup_controllers():
        top = CGROUP_V1 / controller / cgroup_root.lstrip("/")
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            _rmdir_cgroup(d)
        _rmdir_cgroup(top)


def _cgroup_controllers() -> list[str]:
    """The cgroup v1 hierarchies mounted here (cpu, memory, pids, ...), each a directory under /sys/fs/cgroup."""
    return sorted(p.name for p in CGROUP_V1.iterdir()
                  if p.is_dir() and p.name != "unified" and (p / "cgroup.procs").exists())


def _rmdir_cgroup(path: Path) -> None:
    with contextlib.suppress(OSError):  # still busy or already gone: nothing to clean
        path.rmdir()


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target.startswith(prefix):
            mounts.append(target)
    return mounts


