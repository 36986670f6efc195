"""`python benchmarks/autoscale_sim [flags]` (flags: --help; what it measures: the package's docstring)."""

import sys
from pathlib import Path

if not __package__:
    # Run as a directory, Python puts the directory itself first on sys.path: its parent instead, so that the
    # modules are imported as the package they are (their relative imports need it).
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from autoscale_sim.cli import main

main()
