"""The official rerank clients from PyPI, in a virtual environment of their own, called on a URL.

Why apart from the project's environment: the clients bring langchain and llama-index with their own pins, and the
test is that they work unmodified (but for their base URL), not that they fit beside the operator's dependencies.
The environment is built once per ``requirements.txt`` (its hash names it) under the project's cache, from PyPI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from rerank_devcluster.binaries import cache_dir

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "requirements.txt"


def environment() -> Path:
    """The clients' python, building its environment when this machine has none for these requirements."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    home = cache_dir() / f"official-clients-{key}"
    python = home / "bin" / "python"
    if (home / "ready").exists():
        return python
    shutil.rmtree(home, ignore_errors=True)
    partial = home.with_name(home.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True)
    subprocess.run([str(partial / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-r", str(REQUIREMENTS)], check=True, timeout=1200)
    partial.rename(home)  # only its python is run (it finds its packages from where it lies), never its scripts
    (home / "ready").write_text(key)
    return python


def rerank(base_url: str, model: str, query: str, documents: list[str], top_n: int,
           api_key: str = "unused") -> dict[str, Any]:
    """Every client's ranking of ``documents`` for ``query`` from ``base_url``: ``{client: [[index, score], ...]}``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CO_", "COHERE_"))}
    done = subprocess.run([str(environment()), str(HERE / "call.py"), base_url, api_key, model],
                          input=json.dumps({"query": query, "documents": documents, "top_n": top_n}),
                          capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise AssertionError(f"the official clients failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result
