"""``python -m rerank_activator``: the same as the ``rerank-activator`` command."""

from rerank_activator.main import main

main()
