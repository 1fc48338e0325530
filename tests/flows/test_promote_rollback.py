"""promote and rollback flows: gates, a pause for typed approval, then the pointer (or not)."""

from __future__ import annotations

import pytest

from flows.promote import promote_release
from flows.rollback import rollback_channel
from k3artifacts.promotion.moves import promote
from k3artifacts.releases.channels import current, history, read_state
from k3artifacts.stores.file import FileStore
from tests.flow_helpers import run_answered


@pytest.fixture
def store(tmp_path):
    # Overrides the file+S3 parametrized store of tests/fixtures/releases: the flows are thin,
    # the backends are covered by the library tests.
    return FileStore(tmp_path / "store")


def test_promotion_waits_for_approval_then_moves_and_records_it(store, releases, policies, reviewed):
    release = releases.release()
    reviewed(release)
    state = run_answered(
        promote_release, {"decision": "approve", "reviewer": "alice", "reason": "evals look fine"},
        tuple_id=release.id, channel="staging", store_url=store.url, policies_dir=str(policies),
        requested_by="ci", reason="nightly",
    )
    assert state.is_completed(), state
    assert current(store, "staging").tuple_id == release.id
    (entry,) = history(store, "staging")
    assert (entry.who, entry.why) == ("ci", "nightly")
    assert (entry.approval.who, entry.approval.decision, entry.approval.reason) == (
        "alice", "approved", "evals look fine")


def test_rejection_leaves_the_pointer_untouched(store, releases, policies, reviewed):
    serving, candidate = releases.release(), releases.release()
    for r in (serving, candidate):
        reviewed(r)
    promote(store, serving.id, "staging", actor="ci", policies_dir=policies)
    before = read_state(store, "staging")

    state = run_answered(
        promote_release, {"decision": "reject", "reviewer": "bob", "reason": "license changed"},
        tuple_id=candidate.id, channel="staging", store_url=store.url, policies_dir=str(policies),
    )
    assert state.is_cancelled() and state.name == "Rejected"
    assert "rejected by bob: license changed" in state.message
    assert read_state(store, "staging") == before


def test_failing_gate_fails_before_asking_anyone(store, releases, policies):
    release = releases.release()  # license and code never reviewed
    state = promote_release(tuple_id=release.id, channel="staging", store_url=store.url,
                            policies_dir=str(policies), return_state=True)
    assert state.is_failed() and "license" in state.message
    assert read_state(store, "staging").pointer is None


def test_rollback_with_and_without_approval(store, releases, policies, reviewed):
    first, second = releases.release(), releases.release()
    for r in (first, second):
        reviewed(r)
        promote(store, r.id, "staging", actor="ci", policies_dir=policies)

    # Policy (rollback_approval: false for staging): no pause.
    back = rollback_channel(channel="staging", store_url=store.url, policies_dir=str(policies),
                            requested_by="oncall", reason="p99 up")
    assert back["tuple_id"] == first.id and history(store, "staging")[-1].approval is None

    state = run_answered(
        rollback_channel, {"decision": "approve", "reviewer": "carol", "reason": "undo"},
        channel="staging", to=second.id, store_url=store.url, policies_dir=str(policies),
        require_approval=True,
    )
    assert state.is_completed(), state
    last = history(store, "staging")[-1]
    assert (last.action, last.tuple_id, last.approval.who) == ("rollback", second.id, "carol")
