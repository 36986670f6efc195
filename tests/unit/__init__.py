"""Unit tests: no cluster, no ML stack. The folders mirror what they test: ``operator/`` (operator/rerank_operator:
``controllers/``, ``adapters/``, ``core/<concept>/``; its shared helpers ``rerankmodel_gen`` and ``fake_cluster``),
``activator/``, ``sampler/``, ``contracts/``, ``devcluster/`` (hack/rerank_devcluster), ``benchmarks/``, and
``project/`` for whole-repository checks (``operator_metrics_names`` among them)."""
