"""The contract between a model's route and its quality guard.

The operator has the model's route set :data:`MIRROR_TOKEN_HEADER` to the model's mirror token on what it routes, so
on the copies it mirrors to the quality guard too; the guard counts only requests carrying it
(``quality_guard/intake.py``).
"""

from __future__ import annotations

#: The header a model's HTTPRoute sets to its mirror token on what it routes, and so on the copies it mirrors to the
#: quality guard, which counts only requests carrying it.
MIRROR_TOKEN_HEADER = "X-Rerank-Mirror-Token"
