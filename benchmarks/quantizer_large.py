"""A bge-reranker-v2-m3-size model (XLM-RoBERTa large: 24 layers, hidden 1024, 250002 tokens, random weights; 514
positions, so 560M parameters where the real model's 8194 make 568M) through the whole ``rerank-quantize`` command:
wall time, peak RSS of the process tree, output sizes. Prints JSON (``params_m``: the parameters the built model's
safetensors hold, in millions).

    python -m benchmarks.quantizer_large [--workdir DIR] [--keep] [-- extra rerank-quantize args]

Building the random model is not part of the measured time. Peak RSS is sampled from /proc every 100 ms over the
command and all its children (the export child included); the kernel's own high-water marks (ru_maxrss of the
command and of its children) are reported too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tree_rss(pid: int) -> int:
    """Sum of VmRSS over ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
        stack.extend(children.get(p, []))
    return total


def safetensors_params(d: Path) -> int:
    """The parameters the model's safetensors files in ``d`` hold: the element count of every tensor their headers
    list (an 8-byte little-endian length, then that much JSON), read without loading a weight."""
    total = 0
    for f in sorted(d.glob("*.safetensors")):
        with f.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def build_model(d: Path) -> dict:
    from rerank_devcluster import devmodels

    t0 = time.monotonic()
    # initializer_range 0.02 is transformers' default for XLM-R; see devmodels for why tiny models use 0.1.
    devmodels.xlmr_cross_encoder(d, with_tokenizer_json=True, initializer_range=0.02,
                                 **devmodels.xlmr_large_config_kwargs())
    return {"build_s": round(time.monotonic() - t0, 1),
            "safetensors_bytes": (d / "model.safetensors").stat().st_size}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="qlarge-")).resolve()  # the model's builder runs in REPO
    work.mkdir(parents=True, exist_ok=True)
    src = work / "xlmr-large"
    info: dict = {"model": "xlm-roberta-large-shape (random)"}
    if not (src / "model.safetensors").is_file():
        # Build in a child so the benchmark process itself stays small.
        code = ("import json, pathlib, sys; from benchmarks.quantizer_large import build_model; "
                "print(json.dumps(build_model(pathlib.Path(sys.argv[1]))))")
        out = subprocess.run([sys.executable, "-c", code, str(src)], capture_output=True, text=True, check=True,
                             cwd=REPO)
        info.update(json.loads(out.stdout.strip().splitlines()[-1]))
    info["params_m"] = round(safetensors_params(src) / 1e6, 1)
    vol = work / "volume"
    shutil.rmtree(vol, ignore_errors=True)
    cmd = [sys.executable, "-m", "quantizer_job", "--model", str(src), "--output", str(vol), "--artifact-id", "large1",
           *a.extra]
    env = dict(os.environ, TERMINATION_MESSAGE_PATH=str(work / "termination.log"))
    peak = 0
    stop = threading.Event()
    t0 = time.monotonic()
    stderr_log = open(work / "stderr.log", "w")  # noqa: SIM115 - the child writes to it until it exits
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr_log, text=True, env=env)

    def sample():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(p.pid))
            time.sleep(0.1)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    stdout, _ = p.communicate()
    wall = time.monotonic() - t0
    stop.set()
    th.join()
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    result = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    stages = {}
    for line in (work / "stderr.log").read_text().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("event") == "end" and rec["stage"] != "job":
                stages.setdefault(rec["stage"], 0.0)
                stages[rec["stage"]] = round(stages[rec["stage"]] + rec["seconds"], 1)
    sizes = {}
    art = vol / "artifacts" / "large1"
    if art.is_dir():
        for f in sorted(art.rglob("*")):
            if f.is_file():
                sizes[f.relative_to(art).as_posix()] = f.stat().st_size
    info.update(rc=p.returncode, wall_s=round(wall, 1), peak_tree_rss_gib=round(peak / 2**30, 2),
                max_single_process_rss_gib=round(kids / 2**30, 2), stage_seconds=stages,
                reason=result.get("reason"), quality=result.get("quality"), speed=result.get("speed"),
                recipe_tried=(result.get("recipe") or {}).get("tried"), output_bytes=sizes,
                cpu_int8_bytes=sum(v for k, v in sizes.items() if k.startswith("cpu-int8/")),
                original_bytes=sum(v for k, v in sizes.items() if k.startswith("original/")),
                threads=os.cpu_count())
    print(json.dumps(info))
    if not a.keep and a.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
