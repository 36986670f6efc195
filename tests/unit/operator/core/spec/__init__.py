"""core/spec/: the typed spec, its parser, the CRD it agrees with, the TEI flag allow-list."""
