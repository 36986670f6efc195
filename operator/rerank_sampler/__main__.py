"""``python -m rerank_sampler``: the same as the ``rerank-sampler`` command."""

from rerank_sampler.main import main

main()
