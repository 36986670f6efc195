"""The benchmarks: performance and quality figures, each printed as JSON; none is a test.

Each is a module run from the repository root as ``python -m benchmarks.<name> [flags]`` (``--help`` lists them; the
module's docstring says what it measures). What several of them share is a module named for what it is, imported by
name like any other (``from benchmarks import trained_fixture``):

- ``trained_fixture``: the trained cross-encoders the quantization benchmarks measure on (built and cached on first
  use; ``python -m benchmarks.trained_fixture`` builds them ahead);
- ``tei_serving``: model directories served as TEI serves them (a real router or an in-process ONNX Runtime stand-in),
  the concurrent ``/rerank`` clients that drive them, and PyTorch FP32 as the reference;
- ``autoscale_sim``: the spillover simulator (a package; ``python -m benchmarks.autoscale_sim``).
"""
