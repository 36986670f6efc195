import sys

from rerank_devcluster.cli import main

sys.exit(main())
