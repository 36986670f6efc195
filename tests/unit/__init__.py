"""Unit tests: no cluster, no ML stack. Shared helpers: ``rerankmodel_gen`` (RerankModel fixtures and an in-memory
API server), ``fake_cluster`` (the fake ``ClusterAccess``), ``operator_metrics_names``."""
