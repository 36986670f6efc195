"""Tests on the real control plane; ``rrm_harness`` runs the operator as a real process under its real RBAC."""
