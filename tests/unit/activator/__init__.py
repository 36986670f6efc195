"""The activator's unit tests (operator/rerank_activator): real sockets, a real pool stand-in that wakes late;
``activator_helpers`` starts both and speaks HTTP to them."""
