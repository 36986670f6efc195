"""core/: the pure core; one folder per concept folder of operator/rerank_operator/core, its top-level modules here."""
