"""The one exception type the stages raise; its reason is one of contract.FAILURE_REASONS."""

from __future__ import annotations

from typing import Any

from rerank_contracts.quantize_job import EXIT_CODES, FAILURE_REASONS

__all__ = ["EXIT_CODES", "JobError"]


class JobError(Exception):
    def __init__(self, reason: str, message: str, **details: Any) -> None:
        if reason not in FAILURE_REASONS:
            raise ValueError(f"unknown failure reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"

