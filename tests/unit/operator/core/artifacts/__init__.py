"""core/artifacts/: the artifact's identity, the decision, a Job's outcome, sharing."""
