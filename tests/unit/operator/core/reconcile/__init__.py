"""core/reconcile/: what a reconcile read, the plan, drift; a model's life step by step."""
