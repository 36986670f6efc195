"""The quantization Job: a TEI-ready INT8 reranker directory from a hub id or a local model directory."""
