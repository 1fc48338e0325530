"""A rollback can carry a release engineer's approval into the channel history."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from k3artifacts.errors import GateFailed
from k3artifacts.promotion.moves import promote, rollback
from k3artifacts.releases.channels import Approval, current, history
from k3artifacts.releases.policies import load_gate_policy


def _two_promoted(store, releases, policies, reviewed):
    first, second = releases.release(), releases.release()
    for r in (first, second):
        reviewed(r)
        promote(store, r.id, "staging", actor="ci", policies_dir=policies)
    return first, second


def test_approved_rollback_records_the_approval(store, releases, policies, reviewed):
    first, _ = _two_promoted(store, releases, policies, reviewed)
    ok = Approval(who="bob", decision="approved", reason="p99 regressed", when=datetime.now(UTC))
    result = rollback(store, "staging", actor="ci", approval=ok)
    assert result.changed and current(store, "staging").tuple_id == first.id
    assert history(store, "staging")[-1].approval == ok


def test_rejected_rollback_writes_nothing(store, releases, policies, reviewed):
    _, second = _two_promoted(store, releases, policies, reviewed)
    no = Approval(who="bob", decision="rejected", reason="not this one")
    with pytest.raises(GateFailed, match="rejected by bob: not this one"):
        rollback(store, "staging", actor="ci", approval=no)
    assert current(store, "staging").tuple_id == second.id and len(history(store, "staging")) == 2


def test_policy_says_whether_rollback_needs_approval(policies):
    policy = load_gate_policy(policies)
    assert {name: c.rollback_approval for name, c in policy.channels.items()} == {
        "staging": False, "production": False}
