"""core/builders/: the manifests, one child kind each."""
