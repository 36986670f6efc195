"""The API, without a client library (cheap on a 2-core machine that also runs the cluster): JSON over HTTPS with
the admin identity, and watches in daemon threads. It measures nothing itself: every phase reads the cluster with it."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from rerank_devcluster.cluster import Cluster


class Api:
    """JSON over HTTPS with the admin identity; one connection per thread."""

    def __init__(self, cluster: Cluster) -> None:
        pki = cluster.workdir / "pki"
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        url = urllib.parse.urlparse(cluster.server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.local = threading.local()

    def connect(self, timeout: float = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(3):
            conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = self.connect()
            try:
                conn.request(method, path, body=data, headers={"Content-Type": content_type,
                                                                "Accept": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
                return resp.status, json.loads(raw) if raw[:1] == b"{" else raw.decode(errors="replace")
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def ok(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        status, out = self.call(method, path, body, content_type)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {str(out)[:300]}")
        return out

    def watch(self, path: str, handle: Callable[[str, dict[str, Any], float], None], stop: threading.Event,
              query: dict[str, str] | None = None) -> threading.Thread:
        """Watch ``path`` in a daemon thread until ``stop``: ``handle(type, object, time.monotonic())`` for each
        event. Starts with ADDED for what exists; resumes from the last resourceVersion, or from scratch after 410."""

        def run() -> None:
            rv = ""
            while not stop.is_set():
                params = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "240", **(query or {})}
                if rv:
                    params["resourceVersion"] = rv
                conn = self.connect(timeout=300)
                try:
                    conn.request("GET", f"{path}?{urllib.parse.urlencode(params)}",
                                 headers={"Accept": "application/json"})
                    resp = conn.getresponse()
                    if resp.status != 200:
                        resp.read()
                        rv = ""
                        time.sleep(1)
                        continue
                    for line in resp:
                        if stop.is_set():
                            break
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            rv = ""
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if event.get("type") != "BOOKMARK":
                            handle(event["type"], obj, time.monotonic())
                except (OSError, http.client.HTTPException, ValueError):
                    time.sleep(0.5)
                finally:
                    conn.close()

        thread = threading.Thread(target=run, daemon=True, name=f"watch {path}")
        thread.start()
        return thread
