"""``rerank-dev-cluster``: bring the local control plane up for a person at a terminal.

    rerank-dev-cluster up [--workdir DIR] [--real-node]   start, print how to use it, wait for Ctrl-C, tear down
    rerank-dev-cluster build                              build/cache the binaries and the real node's images
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from rerank_devcluster import binaries, nodeimage
from rerank_devcluster.cluster import Cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rerank-dev-cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane and wait")
    up.add_argument("--workdir", type=Path, default=None)
    up.add_argument("--real-node", action="store_true", help="add the real worker node (containerd + kubelet)")
    sub.add_parser("build", help="build and cache the binaries and the real node's images")
    args = parser.parse_args(argv)

    if args.command == "build":
        for name, path in vars(binaries.ensure_all()).items():
            print(f"{name:24} {path}")
        images = nodeimage.ensure_images()
        print(f"{'node images':24} {images.pause.parent} ({images.quantizer_image})")
        return 0

    cluster = Cluster.start(args.workdir, real_node=args.real_node)
    cluster.keep_workdir = args.workdir is not None
    print(f"control plane up: {cluster.server}")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print(f"  export PATH={':'.join(cluster.bins.path_dirs())}:$PATH")
    print(f"  logs: {cluster.logs_dir}")
    print(cluster.kubectl_run("get", "nodes", "-o", "wide").stdout)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
