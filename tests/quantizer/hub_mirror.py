"""A local hub mirror: the part of the HuggingFace hub's HTTP API that ``huggingface_hub`` downloads through
(``/api/models/<repo>/revision/<rev>`` and ``/<repo>/resolve/<commit>/<file>``), serving model directories from
disk. The Job's real hub-loading code (``quantizer_job.steps.storage.fetch``) reaches it through ``HF_ENDPOINT``, as it
reaches a class's mirror in a cluster; ``state`` makes it answer as a hub in an outage (503) or one without the
repository.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

State = Literal["up", "down", "busy"]


class HubMirror:
    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.state: State = "up"
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def commit(self, repo: str) -> str:
        """A commit id made from the files' contents (40 hex digits, as the hub's)."""
        h = hashlib.sha1()
        for p in sorted(self.repos[repo].iterdir()):
            if p.is_file():
                h.update(p.name.encode() + p.read_bytes())
        return h.hexdigest()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self) -> None:
                mirror.requests.append(f"{self.command} {self.path}")
                if mirror.state == "down":
                    return self._send(503, b"upstream unavailable")
                if mirror.state == "busy":
                    return self._send(429, b"rate limited", {"Retry-After": "1"})
                path = self.path.split("?", 1)[0]
                if path.startswith("/api/models/"):
                    repo, _, _rev = path[len("/api/models/"):].partition("/revision/")
                    if repo not in mirror.repos:
                        return self._send(404, b'{"error":"Repository not found"}',
                                          {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"})
                    files = sorted(p.name for p in mirror.repos[repo].iterdir() if p.is_file())
                    info = {"id": repo, "modelId": repo, "sha": mirror.commit(repo), "private": False,
                            "siblings": [{"rfilename": f} for f in files]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                for repo, d in mirror.repos.items():
                    prefix = f"/{repo}/resolve/"
                    if path.startswith(prefix):
                        _commit, _, name = path[len(prefix):].partition("/")
                        f = d / name
                        if not f.is_file():
                            return self._send(404, b"entry not found", {"X-Error-Code": "EntryNotFound"})
                        data = f.read_bytes()
                        return self._send(200, data, {"X-Repo-Commit": mirror.commit(repo),
                                                      "ETag": f'"{hashlib.sha256(data).hexdigest()}"'})
                return self._send(404, b"not found", {"X-Error-Code": "RepoNotFound"})

            do_GET = _route
            do_HEAD = _route

        return Handler


@contextmanager
def running(repos: dict[str, Path]) -> Iterator[HubMirror]:
    mirror = HubMirror(repos)
    thread = threading.Thread(target=mirror.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield mirror
    finally:
        mirror.server.shutdown()
        mirror.server.server_close()
