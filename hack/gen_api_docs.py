#!/usr/bin/env python3
"""Generate docs/api-reference.md from the CRDs (``--check``: exit 1 if it is stale): ``rerank_devcluster.api_docs``."""

import sys

from rerank_devcluster.api_docs import main

if __name__ == "__main__":
    sys.exit(main())
