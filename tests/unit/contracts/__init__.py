"""rerank_contracts/: what the processes exchange (the activator's tokens, the OCI store)."""
