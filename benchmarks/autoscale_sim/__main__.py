"""`python -m benchmarks.autoscale_sim [flags]` (flags: --help; what it measures: the package's docstring)."""

from .cli import main

main()
