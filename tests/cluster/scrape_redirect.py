"""The operator process of tests/cluster/test_autoscaling.py: ``python scrape_redirect.py FILE <operator flags>``.

kwok pods have no network, so the test serves each fake TEI pod's /metrics from a local port and keeps
``{pod name: "host:port"}`` in FILE while the operator runs. This launcher (test code: production reads no such
override) points the direct metrics source at those addresses, re-reading FILE on every scrape, then runs the
operator exactly as ``python -m rerank_operator.main`` would.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from rerank_operator import main as operator_main
from rerank_operator.adapters import tei_scrape as direct


def redirected(path: str) -> Callable[[direct.PodTarget], str]:
    default = direct.pod_address

    def address(target: direct.PodTarget) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                table = json.loads(f.read() or "{}")
        except (OSError, ValueError):  # the test is rewriting the file: this scrape uses the pod's own address
            table = {}
        return str(table.get(target.name) or default(target))

    return address


if __name__ == "__main__":
    direct.pod_address = redirected(sys.argv[1])
    sys.exit(operator_main.main(sys.argv[2:]))
