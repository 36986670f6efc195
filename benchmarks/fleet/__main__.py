"""`python -m benchmarks.fleet [flags]` (flags: --help; what it measures: the package's docstring)."""

import sys

from .cli import main

sys.exit(main())
