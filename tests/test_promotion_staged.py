"""From revisions staged by the real pipeline (local hub, real huggingface_hub client) to a
channel and back: the gates judge what staging actually publishes."""

from __future__ import annotations

import pytest

from k3artifacts.errors import GateFailed, NotFound
from k3artifacts.releases.channels import history
from k3artifacts.releases.reviewing import review_code, review_license
from tests.fixtures.moves import check_gates, promote, rollback
from tests.fixtures.people import person
from tests.staging_helpers import REPO, run_stage, small_release


def test_staged_revisions_through_gates_promotion_and_rollback(
    local_hub, store, releases, policies, tmp_path
):
    def staged(seed: int):
        local_hub.hub.add_commit(REPO, small_release(tmp_path, shard_bytes=64 << 10, seed=seed))
        result = run_stage(local_hub.endpoint, store, tmp_path / "quarantine")
        return releases.tuple_for(store.read_manifest(REPO, result.commit))

    first = staged(0)
    report = check_gates(store, first.id, "staging", policies_dir=policies)
    verdicts = {r.name: r.passed for r in report.results}
    assert verdicts == {"artifact": True, "license": False, "remote_code": False}
    assert "modeling_kimi_k3.py" in report.failed[1].reason
    with pytest.raises(GateFailed):
        promote(store, first.id, "staging", actor="alice", policies_dir=policies)

    review_license(store, first.id, by=person("alice"))
    assert review_code(store, first.id, by=person("alice")).recorded
    promote(store, first.id, "staging", actor="alice", policies_dir=policies)

    # The next upstream revision carries the same license text and code: no new review.
    second = staged(1)
    assert second.binding.weights.commit != first.binding.weights.commit
    assert check_gates(store, second.id, "staging", policies_dir=policies).passed
    promote(store, second.id, "staging", actor="alice", policies_dir=policies)

    back = rollback(store, "staging", actor="bob", reason="regression")
    assert back.tuple_id == first.id
    rollback(store, "staging", actor="bob")  # undo: back on the second
    store.delete_revision(REPO, first.binding.weights.commit)
    with pytest.raises(NotFound, match=first.binding.weights.commit):
        rollback(store, "staging", actor="bob")
    assert [e.tuple_id for e in history(store, "staging")] == [
        first.id,
        second.id,
        first.id,
        second.id,
    ]
