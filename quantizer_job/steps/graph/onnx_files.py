"""The rules every ONNX file the Job writes follows, whichever step wrote it.

A graph's size counts its external data file (``model.onnx_data``); a saved graph's data file is renamed to the name
TEI's ONNX Runtime looks for (``<graph>_data``) and its IR version lowered to one that runtime reads. The fusion pass,
both quantizers and the embedding-table rewrite all save graphs, so the rules live here once rather than in each.
"""

from __future__ import annotations

from pathlib import Path

from quantizer_job.steps.graph import external_data

#: A protobuf holds at most 2 GB: graphs near this size are saved with their tensors in an external data file.
TWO_GB = 2 * 1024**3
#: ONNX Runtime 1.22 loads IR versions up to 10 reliably; onnx >= 1.17 writes newer ones by default.
MAX_IR_VERSION = 10


def _set_ir_version(path: Path) -> None:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    if m.ir_version > MAX_IR_VERSION:
        m.ir_version = MAX_IR_VERSION
        with open(path, "wb") as f:
            f.write(m.SerializeToString())


def model_bytes(path: Path) -> int:
    """Size of an ONNX graph with its external data file (``model.onnx_data``)."""
    total = path.stat().st_size
    data = path.with_name(external_data.data_file_name(path))
    if data.exists():
        total += data.stat().st_size
    return total


def finish_saved_model(path: Path) -> None:
    """What every model the Job writes needs before TEI can load it: the external data file (if any)
    named ``<graph>_data`` next to the graph, and an IR version TEI's ONNX Runtime reads."""
    external_data.name_data_file(path)
    _set_ir_version(path)
