"""What judging a tuple against a channel's gates produces, as the channel history records it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, computed_field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GateResult(_Frozen):
    name: str
    passed: bool
    reason: str
    #: Failed, but the mover overrode it with a reason (see ``HistoryEntry.overrides``).
    overridden: bool = False


class Override(_Frozen):
    gate: str
    reason: str = Field(min_length=1)


def policy_label(version: int, digest: str) -> str:
    """The policy that judged, in words: a version of the store's, or the packaged defaults
    (version 0) a store without one is judged by."""
    if version == 0:
        return f"packaged defaults {digest[:12]} (not yet recorded in the store)"
    return f"version {version} ({digest[:12]})"


class GateReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    tuple_id: str
    channel: str
    results: list[GateResult]
    #: The store's policy version the gates were read from (``policy/record.py``).
    policy_digest: str | None = None
    policy_version: int | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[GateResult]:
        return [r for r in self.results if not r.passed]


GATE_TABLE_HEADER = ["gate", "result", "reason"]


def gate_rows(results: list[GateResult]) -> list[list[str]]:
    """The gate results table every front end shows (terminal, flow artifact): one wording."""
    return [
        [r.name, "pass" if r.passed else ("FAIL (overridden)" if r.overridden else "FAIL"),
         r.reason]
        for r in results
    ]
