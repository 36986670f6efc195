"""The guard's tier: pure tests of quality_guard (and one that scores with ONNX Runtime on the trained fixture).

quality_guard/ sits beside quantizer_job/ at the repository root; the editable install made before it existed does
not map it, so the root goes on sys.path here (as the benchmarks do for themselves)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
