"""What a channel move leaves for an auditor: the promote/rollback artifact and one log line.

Both say who asked and why, who approved and why, from which tuple to which (each as
repo@commit, manifest digest, full image reference, profile), every gate run with its result,
and the channel history's sequence number, so the record reads alone, without ``k3a history``.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3artifacts.errors import K3AError
from k3artifacts.policy.results import GATE_TABLE_HEADER, GateResult, gate_rows
from k3artifacts.promotion.moves import MoveResult
from k3artifacts.releases.channels import Approval
from k3artifacts.releases.tuples import TupleStore
from k3artifacts.stores.base import Store

from .artifacts import md_table, sha256


@dataclass(frozen=True)
class TupleFacts:
    """What a tuple binds, as a reviewer reads it."""

    id: str
    repo_id: str
    commit: str
    manifest_digest: str
    image: str
    profile: str

    @property
    def weights(self) -> str:
        return f"{self.repo_id}@{self.commit}"

    def one_line(self) -> str:
        return (f"{self.id} ({self.weights}, manifest {sha256(self.manifest_digest)}, "
                f"image {self.image}, profile {self.profile})")


def tuple_facts(store: Store, tuple_id: str | None) -> TupleFacts | None:
    """The facts of ``tuple_id``; None when there is none (an empty channel) or it cannot be
    read (the move itself then says why)."""
    if tuple_id is None:
        return None
    try:
        b = TupleStore(store).get(tuple_id).binding
    except K3AError:
        return None
    return TupleFacts(tuple_id, b.weights.repo_id, b.weights.commit, b.weights.manifest_digest,
                      b.image.reference, b.serving.profile)


def verdict(gate: GateResult) -> str:
    return "pass" if gate.passed else ("overridden" if gate.overridden else "FAIL")


def gate_table(results: list[GateResult]) -> str:
    if not results:
        return "_no gates ran_"
    # The library's one wording of gate results (the terminal shows the same rows).
    return md_table(GATE_TABLE_HEADER,
                    ((name, "**FAIL**" if result == "FAIL" else result, why)
                     for name, result, why in gate_rows(results)))


def tuples_table(before: TupleFacts | None, after: TupleFacts | None) -> str:
    def col(f: TupleFacts | None, attr: str) -> str:
        if f is None:
            return "(nothing)"
        value = getattr(f, attr)
        return f"`{sha256(value)}`" if attr == "manifest_digest" else f"`{value}`"

    fields = (("tuple", "id"), ("weights", "weights"), ("manifest digest", "manifest_digest"),
              ("image", "image"), ("profile", "profile"))
    return md_table(("", "from", "to"), ((label, col(before, a), col(after, a))
                                         for label, a in fields))


def _said(who: str | None, why: str | None) -> str:
    return f"{who or '(unknown)'}" + (f' ("{why}")' if why else " (no reason given)")


def move_record(action: str, result: MoveResult, *, before: TupleFacts | None,
                after: TupleFacts | None, requested_by: str | None, reason: str | None,
                approval: Approval | None) -> str:
    """The markdown of a finished promote or rollback."""
    state = "moved" if result.changed else "already there (nothing written)"
    approved = _said(approval.who, approval.reason) if approval else "not required"
    return (
        f"# {action} {result.channel}: {state}\n\n"
        + md_table(("field", "value"), [
            ("channel", result.channel),
            ("history", f"#{result.entry.seq}"),
            ("requested by", _said(requested_by or result.entry.who, reason or result.entry.why)),
            ("approved by", approved),
            ("recorded mover", result.entry.who),
        ])
        + "\n\n## Tuples\n\n" + tuples_table(before, after)
        + "\n\n## Gates\n\n" + gate_table(result.gates)
    )


def outcome_line(action: str, result: MoveResult, *, before: TupleFacts | None,
                 after: TupleFacts | None, requested_by: str | None, reason: str | None,
                 approval: Approval | None) -> str:
    """The same facts as one log line (for log search and the run's log tab)."""
    gates = ", ".join(f"{g.name} {verdict(g)}" for g in result.gates) or "none"
    approved = _said(approval.who, approval.reason) if approval else "not required"
    frm = before.one_line() if before else (result.previous_tuple_id or "(nothing)")
    to = after.one_line() if after else result.tuple_id
    what = "moved" if result.changed else "already there"
    return (f"{action} {result.channel} {what}, history #{result.entry.seq}: from {frm} to {to}; "
            f"requested by {_said(requested_by or result.entry.who, reason or result.entry.why)}"
            f"; approved by {approved}; gates: {gates}")
