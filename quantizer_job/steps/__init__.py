"""What the stages call, grouped by concept: ``graph/`` (ONNX graphs exported, fused, quantized, saved),
``recipe_search/`` (the recipes and the choice among them), ``evaluation/`` (pairs, metrics, the quality gate, speed
as served), ``tei/`` (the directory TEI loads, its tokenizing), ``storage/`` (the model fetched, the artifact
published) and ``common/`` (the Job's error, logs, reported numbers, CPU). A step never imports the run or a stage
(an import-linter contract); the quality guard and the benchmarks import steps too."""
