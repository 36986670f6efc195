"""What the model says: the status computed from a reconcile, Ready as a chain of checks, conditions and their reasons,
Events."""
