"""The operator with kwok pods' /metrics served locally: ``python -m rerank_devcluster.scrape_redirect FILE <flags>``.

kwok pods have no network, so a test or benchmark serves each fake TEI pod's /metrics from a local port
(:mod:`rerank_devcluster.fake_tei`) and keeps ``{pod name: "host:port"}`` in FILE while the operator runs; the key
``"*"`` is the address of every pod not named (one server for a whole fleet). This launcher (test code: production
reads no such override) points the direct metrics source at those addresses, re-reading FILE whenever it changes,
then runs the operator exactly as ``python -m rerank_operator.main`` would.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from rerank_operator import main as operator_main
from rerank_operator.adapters import tei_scrape as direct

#: The key of the address that serves every pod the table does not name.
ANY_POD = "*"


def redirected(path: str) -> Callable[[direct.Addressable], str]:
    """``pod_address`` replaced: the table in ``path`` first (re-read when its size or mtime change), then ``"*"``,
    then the pod's own address."""
    default = direct.pod_address
    cache: dict[str, object] = {"key": None, "table": {}}

    def table() -> dict[str, str]:
        try:
            st = os.stat(path)
            key = (st.st_mtime_ns, st.st_size)
            if key != cache["key"]:
                with open(path, encoding="utf-8") as f:
                    cache["table"] = json.loads(f.read() or "{}")
                cache["key"] = key
        except (OSError, ValueError):  # the writer is rewriting the file: this scrape uses the pod's own address
            cache["key"] = None
            return {}
        current = cache["table"]
        return current if isinstance(current, dict) else {}

    def address(target: direct.Addressable) -> str:
        addresses = table()
        return str(addresses.get(target.name) or addresses.get(ANY_POD) or default(target))

    return address


def publish(path: Path, table: Mapping[str, str]) -> None:
    """Write FILE whole (a temporary file renamed over it): the operator re-reads it while a test rewrites it, and a
    half-written table would send a scrape to a pod's own, unreachable address."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(table), sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    direct.pod_address = redirected(argv[0])  # type: ignore[assignment]  # replaced for this process only
    return operator_main.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
