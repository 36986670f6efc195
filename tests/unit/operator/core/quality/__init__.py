"""core/quality/: the operator's side of the quality guard: verdicts, canaries, re-quantization."""
