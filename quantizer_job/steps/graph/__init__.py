"""ONNX graphs: the FP32 export (``export``, the child process, the only module that imports torch), ONNX Runtime's
fusions (``fusion``), INT8 quantization and one recipe built end to end (``quantize``), the Job's own rewrites
(``embedding_int8``, ``matmul_int8``), the MatMuls a mixed recipe keeps FP32 (``outliers``), and how every graph is
saved (``onnx_files``; ``external_data`` for graphs over 2 GB)."""
