"""Where a model comes from and where the artifact goes: the source fetched, a local directory or a hub repo at a
pinned revision (``fetch``), and the artifact published on the model volume in one atomic rename (``publish``)."""
