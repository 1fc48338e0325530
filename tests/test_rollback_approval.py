"""A rollback carries an approval record into the channel history, and the store's policy
decides whether it needs one: the library enforces it, so `k3a rollback` and the flow agree."""

from __future__ import annotations

import pytest

from k3artifacts.errors import GateFailed
from k3artifacts.policy.approvals import request_approval
from k3artifacts.policy.decide import decide
from k3artifacts.policy.model import load_gate_policy
from k3artifacts.policy.record import in_force
from k3artifacts.promotion.moves import ApprovalNeeded
from k3artifacts.releases.channels import current, history
from tests.fixtures.moves import as_acting, promote, rollback, use_policy


def _two_promoted(store, releases, policies, reviewed):
    first, second = releases.release(), releases.release()
    for r in (first, second):
        reviewed(r)
        promote(store, r.id, "staging", actor="ci", policies_dir=policies)
    return first, second


def _requested(store, first, *, approver, approve=True, reason="p99 regressed"):
    request = request_approval(store, action="rollback", by=as_acting("oncall"),
                               channel="staging", tuple_id=first.id)
    decide(store, request.id, by=as_acting(approver), approve=approve, reason=reason)
    return request.id


def test_approved_rollback_records_the_approval(store, releases, policies, reviewed):
    first, _ = _two_promoted(store, releases, policies, reviewed)
    request_id = _requested(store, first, approver="bob")
    result = rollback(store, "staging", actor="ci", approval=request_id)
    assert result.changed and current(store, "staging").tuple_id == first.id
    approval = history(store, "staging")[-1].approval
    assert (approval.who, approval.who_source, approval.decision, approval.request_id) == (
        "bob", "key", "approved", request_id)


def test_rejected_rollback_writes_nothing(store, releases, policies, reviewed):
    first, second = _two_promoted(store, releases, policies, reviewed)
    request_id = _requested(store, first, approver="bob", approve=False, reason="not this one")
    with pytest.raises(GateFailed, match="rejected by bob: not this one"):
        rollback(store, "staging", actor="ci", approval=request_id)
    assert current(store, "staging").tuple_id == second.id and len(history(store, "staging")) == 2


def test_policy_says_whether_rollback_needs_approval(policies):
    policy = load_gate_policy(policies)
    assert {name: c.rollback_approval for name, c in policy.channels.items()} == {
        "staging": False, "production": False}


def test_rollback_approval_is_enforced_by_the_library_for_every_caller(
    store, releases, policies, reviewed
):
    first, second = _two_promoted(store, releases, policies, reviewed)
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n",
        "    gates: [artifact, license, remote_code]\n    rollback_approval: true\n", 1))
    use_policy(store, policies)
    assert in_force(store).document.gates.channels["staging"].rollback_approval
    with pytest.raises(ApprovalNeeded, match="requires an approval") as needed:
        rollback(store, "staging", actor="ci")
    assert "k3a approve" in needed.value.hint
    # An approval of another move does not do either.
    other = request_approval(store, action="rollback", by=as_acting("oncall"), channel="staging",
                             tuple_id=second.id)
    decide(store, other.id, by=as_acting("bob"), approve=True)
    with pytest.raises(GateFailed, match="not this rollback"):
        rollback(store, "staging", actor="ci", approval=other.id)
    assert current(store, "staging").tuple_id == second.id
    result = rollback(store, "staging", actor="ci", approval=_requested(store, first,
                                                                         approver="bob"))
    assert result.tuple_id == first.id and history(store, "staging")[-1].approval.who == "bob"
