"""What a preflight found: one :class:`CheckOutcome` per named check, with its evidence."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from k3artifacts.policy.rollout import InfrastructurePolicy

CHECKS = ("capacity", "storage_throughput", "iam", "private_networking", "node_health")


class CheckOutcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Literal["capacity", "storage_throughput", "iam", "private_networking", "node_health"]
    passed: bool
    reason: str
    #: What the check read (ids, counts, dates, figures), for the record.
    evidence: dict[str, Any]


class PreflightReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    tuple_id: str
    channel: str
    at: datetime
    policy: InfrastructurePolicy
    checks: list[CheckOutcome]

    @property
    def passed(self) -> bool:
        return {c.name for c in self.checks} == set(CHECKS) and all(c.passed for c in self.checks)
