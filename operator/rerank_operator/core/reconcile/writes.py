"""What executing a plan did: the objects written and the writes the API server refused. Pure data.

A refusal keeps what it was about (an ``ObjectRef``: a Deployment and a Service may share a name), the HTTP status
and the API server's own message, so a ResourceQuota's 403 is told from other refusals whichever verb hit it
(apply, create, scale or delete), and the text the status shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rerank_operator.core import tenancy
from rerank_operator.core.reconcile.observed import ObjectRef

Verb = str  # "apply" | "create" | "scale" | "delete"


@dataclass(frozen=True)
class Refused:
    """A write the API server refused for a reason a retry will not fix (transient failures raise instead)."""

    ref: ObjectRef
    verb: Verb
    status: int
    message: str  # the API server's own message
    text: str  # what the status shows: verb, object, HTTP status, message and any hint

    def __str__(self) -> str:
        return self.text

    @property
    def is_quota(self) -> bool:
        """Refused by a ResourceQuota (a 403 whose message says so)."""
        return self.status == 403 and tenancy.is_quota_message(self.message)


@dataclass(frozen=True)
class Executed:
    """The outcome of ``Cluster.execute``: what was written, in order, and what was refused."""

    done: tuple[ObjectRef, ...] = ()
    refused: tuple[Refused, ...] = field(default_factory=tuple)

    def wrote(self, ref: ObjectRef) -> bool:
        return ref in self.done

    @property
    def quota_refusals(self) -> tuple[Refused, ...]:
        return tuple(r for r in self.refused if r.is_quota)

    @property
    def other_refusals(self) -> tuple[Refused, ...]:
        return tuple(r for r in self.refused if not r.is_quota)
