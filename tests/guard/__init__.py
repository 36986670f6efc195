"""The guard's tier: pure tests of quality_guard, and its server against TEI-like servers that really score
(``scoring_server``: ONNX Runtime on an exported cross-encoder, shared with tests/cluster)."""
