"""The operator harness's fixtures, for every test in this folder: ``operator_identity`` (session) and ``rrm_env``
(per test) are defined in rrm_harness.py, with the harness they drive; importing them here registers them once, so a
test module asks for them by name and need not import them (an import that pyflakes would see as unused)."""

from tests.cluster.rrm_harness import operator_identity, rrm_env

__all__ = ["operator_identity", "rrm_env"]
