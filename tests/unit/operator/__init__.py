"""The operator's unit tests (operator/rerank_operator), laid out like its source: main.py and rbac_rules.yaml here,
then controllers/, adapters/ and core/. Shared helpers: ``rerankmodel_gen`` (RerankModel fixtures and an in-memory API
server) and ``fake_cluster`` (the fake ``ClusterAccess``)."""
