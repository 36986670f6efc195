"""The external data of graphs over 2 GB, read and written a tensor at a time.

A protobuf holds at most 2 GB, so a large model's tensors live in a file beside the graph (``<graph>_data``, the
name TEI's ONNX Runtime looks for), each at an offset and length the graph records. Three stages touch it, and all
use this module so that no stage ever holds the whole model: the export gathers ``torch.onnx.export``'s one file per
tensor into one (``consolidate``), the optimizer's and quantizer's saves are renamed to the expected name
(``name_data_file``), and the large-model MatMul quantizer reads one weight and writes its INT8 form
(``TensorReader``, ``DataWriter``).

Reads are positional (``os.pread``), not memory maps: mapped pages would count as the Job's memory. Tensors are
written page-aligned (ONNX Runtime maps aligned external data instead of copying it), a file appears under its name
only once all of it is written and synced, and a failure leaves nothing under the final name.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

#: Tensors are written at offsets aligned to this (ONNX Runtime maps page-aligned external data).
ALIGN = 4096
#: Tensors are copied in chunks of this size (the embedding table of XLM-R large is 1 GB).
CHUNK = 64 * 1024 * 1024
DATA_FILE_SUFFIX = "_data"


def data_file_name(graph: Path) -> str:
    """The external data file TEI's ONNX Runtime expects next to ``graph``: ``model.onnx`` -> ``model.onnx_data``."""
    return graph.name + DATA_FILE_SUFFIX


#: At most this many source files are open at once (torch.onnx.export writes one file per tensor: hundreds).
MAX_OPEN_FILES = 16


def location(t: Any) -> str | None:
    """The file an external tensor's data is in, else None."""
    from onnx.external_data_helper import uses_external_data

    if not uses_external_data(t):
        return None
    return next((e.value for e in t.external_data if e.key == "location"), None)


def external_tensors(model: Any) -> list[tuple[Any, str]]:
    """Every tensor of a loaded graph (initializers, constants, subgraphs) whose data is external, with its file."""
    from onnx.external_data_helper import _get_all_tensors

    return [(t, loc) for t in _get_all_tensors(model) if (loc := location(t)) is not None]


class TensorReader:
    """Initializers of a graph at ``src``: inline ones decoded, external ones read from their files."""

    def __init__(self, src: Path) -> None:
        self.base = src.parent
        self._files: dict[str, BinaryIO] = {}

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self._files.values():
            f.close()

    @staticmethod
    def external(t: Any) -> tuple[str, int, int] | None:
        """(location, offset, length) of an external tensor, else None."""
        if location(t) is None:
            return None
        info = {e.key: e.value for e in t.external_data}
        loc, off = info["location"], int(info.get("offset", 0))
        if "length" in info:
            return loc, off, int(info["length"])
        from onnx import helper

        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        return loc, off, int(np.prod(t.dims, dtype=np.int64)) * itemsize

    def read(self, loc: str, offset: int, length: int) -> bytes:
        if loc not in self._files:
            if len(self._files) >= MAX_OPEN_FILES:  # the oldest opened goes: files are mostly read in order
                self._files.pop(next(iter(self._files))).close()
            self._files[loc] = open(self.base / loc, "rb")  # noqa: SIM115 - closed by __exit__ or above
        data = os.pread(self._files[loc].fileno(), length, offset)
        if len(data) != length:
            raise OSError(f"external data {loc} is shorter than recorded")
        return data

    def array(self, t: Any) -> np.ndarray:
        """An FP32 tensor's values."""
        from onnx import numpy_helper

        ext = self.external(t)
        if ext is None:
            return np.asarray(numpy_helper.to_array(t), dtype=np.float32)
        return np.frombuffer(self.read(*ext), dtype=np.float32).reshape(tuple(t.dims))


class DataWriter:
    """Appends tensors to one external data file, page-aligned; the file appears under ``path`` only when all of it
    is written and synced (``<path>.part`` until then, removed on failure)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".part")
        self.offset = 0

    def __enter__(self) -> DataWriter:
        self.out = open(self.tmp, "wb")  # closed by __exit__
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.out.flush()
                os.fsync(self.out.fileno())  # a full disk often shows only here
            self.out.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
        except BaseException:
            self.out.close()
            self.tmp.unlink(missing_ok=True)
            raise
        if exc_type is not None:
            self.tmp.unlink(missing_ok=True)

    def add(self, name: str, arr: np.ndarray) -> Any:
        """A new tensor ``name`` holding ``arr``, its data written here."""
        from onnx import numpy_helper

        t = numpy_helper.from_array(arr, name)
        data = t.raw_data
        self._start()
        self.out.write(data)
        return self._point(t, len(data))

    def copy(self, t: Any, reader: TensorReader) -> Any:
        """``t`` as it is: an inline tensor stays inline, an external one is copied here in chunks."""
        ext = reader.external(t)
        if ext is None:
            return t
        loc, offset, length = ext
        self._start()
        for at in range(0, length, CHUNK):
            self.out.write(reader.read(loc, offset + at, min(CHUNK, length - at)))
        return self._point(t, length)

    def _start(self) -> None:
        pad = (-self.offset) % ALIGN
        if pad:
            self.out.write(b"\0" * pad)
            self.offset += pad

    def _point(self, t: Any, length: int) -> Any:
        """Make ``t`` refer to the ``length`` bytes just written at the current tensor's offset."""
        from onnx import TensorProto

        t.data_location = TensorProto.EXTERNAL
        t.ClearField("raw_data")
        del t.external_data[:]
        for k, v in (("location", self.path.name), ("offset", str(self.offset)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.offset += length
        return t


def consolidate(graph: Path) -> int:
    """Gather every external tensor of the graph at ``graph`` (initializers, constants, subgraphs) into
    ``<graph>_data``, a tensor at a time, and remove the files they came from. Returns the data file's size (0 if
    the graph keeps all tensors inline).

    The new graph is written (to ``<graph>.part``) before the data file takes its name, so a failure anywhere leaves
    the graph and its files as they were; only a crash between the two renames leaves the old graph beside the new
    data file (which matters only if the old graph used that name too)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    tensors = external_tensors(model)
    if not tensors:
        return 0
    data_name = data_file_name(graph)
    part: Path | None = None
    try:
        with TensorReader(graph) as reader, DataWriter(graph.with_name(data_name)) as writer:
            for t, _ in tensors:
                writer.copy(t, reader)
            part = _graph_part(model, graph)
    except BaseException:
        if part is not None:
            part.unlink(missing_ok=True)
        raise
    os.replace(part, graph)
    for loc in {loc for _, loc in tensors} - {data_name}:
        with contextlib.suppress(FileNotFoundError):
            os.remove(graph.parent / loc)
    return writer.offset


def name_data_file(graph: Path) -> None:
    """Make the graph's external data (if any) one file named ``<graph>_data`` beside it: a single file under
    another name gets that name (its layout as its saver wrote it), several are consolidated. The graph is never
    left pointing at a file that is gone: the data is linked under the new name, the graph saved, then the old name
    removed."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    tensors = external_tensors(model)
    locations = {loc for _, loc in tensors}
    want = data_file_name(graph)
    if not locations or locations == {want}:
        return
    if len(locations) != 1:
        consolidate(graph)
        return
    (old,) = locations
    for t, _ in tensors:
        for e in t.external_data:
            if e.key == "location":
                e.value = want
    (graph.parent / want).unlink(missing_ok=True)  # not the graph's: it names only ``old``
    try:
        os.link(graph.parent / old, graph.parent / want)
    except OSError:  # a volume without hard links: rename, then save (a crash in between needs a new Job anyway)
        os.replace(graph.parent / old, graph.parent / want)
        save_graph(model, graph)
        return
    save_graph(model, graph)
    os.remove(graph.parent / old)


def save_graph(model: Any, graph: Path) -> None:
    """Write the graph (its tensors' data already in place) by a rename: never half-written."""
    os.replace(_graph_part(model, graph), graph)


def _graph_part(model: Any, graph: Path) -> Path:
    """The serialized graph in ``<graph>.part``, synced; nothing left behind on failure."""
    part = graph.with_name(graph.name + ".part")
    try:
        with open(part, "wb") as f:
            f.write(model.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return part
