"""``rerank-quantize``: the quantization Job's entry point.

It only parses the command line (the flags are the operator's contract,
:func:`rerank_contracts.quantize_job.add_arguments`) and runs :mod:`quantizer_job.pipeline`, then writes the
:class:`~rerank_contracts.quantize_job.JobResult` as the termination message and as the last line of stdout, and exits
with the failure reason's code. Stage events are structured JSON lines on stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from types import FrameType

from quantizer_job.pipeline import Terminated, execute
from quantizer_job.steps.common.errors import EXIT_CODES
from rerank_contracts import quantize_job
from rerank_contracts.quantize_job import JobResult


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"signal {signum}")


def write_termination_message(text: str) -> None:
    """Write where the kubelet reads it; outside a pod (no writable path) there is nothing to write."""
    path = os.environ.get("TERMINATION_MESSAGE_PATH", quantize_job.TERMINATION_MESSAGE_PATH)
    d = os.path.dirname(path) or "."
    if not (os.path.isdir(d) and ((os.path.exists(path) and os.access(path, os.W_OK)) or os.access(d, os.W_OK))):
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass


def report(result: JobResult) -> None:
    text = result.to_message()
    write_termination_message(text)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="rerank-quantize", description=(__doc__ or "").splitlines()[0])
    quantize_job.add_arguments(parser)
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        report(JobResult(ok=False, reason="InvalidInput", message="bad command line (see stderr)"))
        return EXIT_CODES["InvalidInput"]
    req = quantize_job.request_from_namespace(ns)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger().setLevel(logging.ERROR)  # ORT's quantizer warns on the root logger; our logs are JSON
    signal.signal(signal.SIGTERM, _on_sigterm)
    result, code = execute(req)
    report(result)
    return code


if __name__ == "__main__":
    sys.exit(main())
