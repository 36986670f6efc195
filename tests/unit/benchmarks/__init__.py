"""benchmarks/: the benchmarks' own bookkeeping (the simulator, the fleet harness, the wake reading)."""
