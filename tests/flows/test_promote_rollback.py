"""promote and rollback flows: gates, an approval record in the store, then the pointer (or
not). The approver is whoever answered the request with their own identity; a name typed into
the flow is shown, never judged."""

from __future__ import annotations

import os
import pwd
import threading

import pytest

from flows.promote import promote_release
from flows.rollback import rollback_channel
from k3artifacts.policy.approvals import PREFIX, get_request
from k3artifacts.releases.channels import current, history, read_state
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.stores.file import FileStore
from tests.fixtures.identities import k3a_as, pin_as
from tests.fixtures.moves import promote, use_policy
from tests.fixtures.people import person
from tests.flow_helpers import run_answered
from tests.support.releases import Releases
from tests.support.waiting import wait_until

ME = pwd.getpwuid(os.getuid()).pw_name


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
        tuple_id=release.id, channel="staging", store_url=store.url,
        requested_by="ci", reason="nightly",
    )
    assert state.is_completed(), state
    assert current(store, "staging").tuple_id == release.id
    (entry,) = history(store, "staging")
    # The mover is the flow's own identity; the typed requester is not recorded as anyone.
    assert (entry.who, entry.who_source, entry.why) == (ME, "key", "nightly")
    assert (entry.approval.who, entry.approval.decision, entry.approval.reason) == (
        "alice", "approved", "evals look fine")
    request = get_request(store, entry.approval.request_id)
    assert request.requested_for == "ci" and request.requested_by.name == ME


def test_rejection_leaves_the_pointer_untouched(store, releases, policies, reviewed):
    serving, candidate = releases.release(), releases.release()
    for r in (serving, candidate):
        reviewed(r)
    promote(store, serving.id, "staging", actor="ci", policies_dir=policies)
    before = read_state(store, "staging")

    state = run_answered(
        promote_release, {"decision": "reject", "reviewer": "bob", "reason": "license changed"},
        tuple_id=candidate.id, channel="staging", store_url=store.url,
    )
    assert state.is_cancelled() and state.name == "Rejected"
    assert "rejected by bob: license changed" in state.message
    assert read_state(store, "staging") == before


def test_failing_gate_fails_before_asking_anyone(store, releases, policies):
    release = releases.release()  # license and code never reviewed
    state = promote_release(tuple_id=release.id, channel="staging", store_url=store.url,
                            return_state=True)
    assert state.is_failed() and "license" in state.message
    assert read_state(store, "staging").pointer is None
    assert store.list_keys(PREFIX) == []  # nobody was asked


def test_rollback_with_and_without_approval(store, releases, policies, reviewed):
    first, second = releases.release(), releases.release()
    for r in (first, second):
        reviewed(r)
        promote(store, r.id, "staging", actor="ci", policies_dir=policies)

    # Policy (rollback_approval: false for staging): no wait.
    back = rollback_channel(channel="staging", store_url=store.url,
                            requested_by="oncall", reason="p99 up")
    assert back["tuple_id"] == first.id and history(store, "staging")[-1].approval is None

    state = run_answered(
        rollback_channel, {"decision": "approve", "reviewer": "carol", "reason": "undo"},
        channel="staging", to=second.id, store_url=store.url,
        require_approval=True,
    )
    assert state.is_completed(), state
    last = history(store, "staging")[-1]
    assert (last.action, last.tuple_id, last.approval.who) == ("rollback", second.id, "carol")


def _answer_with_k3a(store, user, k3a_env, box):
    """Wait for the flow's request, then answer it with the real `k3a approve`, as ``user``."""
    def run():
        try:
            keys = wait_until(
                lambda: [k for k in store.list_keys(PREFIX) if k.endswith("/request.json")],
                "the flow's approval request", timeout=120, interval=0.2)
            request_id = keys[0].split("/")[-2]
            box.append(k3a_as(user, store, "approve", request_id, "--reason", "ok",
                              env=k3a_env))
        except Exception as exc:  # noqa: BLE001 - handed to the test (a timeout included)
            box.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("reviewer", ["second", "me"])
def test_separation_of_duties_judges_the_approvers_identity_not_a_typed_name(
    reviewer, shared_store, second_user, policies, k3a_env, tmp_path
):
    """A second OS user approves a promotion with the real `k3a approve`, under its own uid;
    the flow was started typing another name ("bob"). The channel requires separation of
    duties, and the approver is the promoter it judges: when the approver also reviewed the
    release it is refused, whatever was typed; when someone else (this process's account)
    reviewed, it moves, and the history names the approver."""
    store = shared_store
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n",
        "    gates: [artifact, license, remote_code, separation_of_duties]\n"
        "    duties: {not_reviewer_of: [license, code]}\n", 1))
    use_policy(store, policies)
    pin_as(second_user, store, k3a_env)
    release = Releases(store, tmp_path / "scratch").release()
    if reviewer == "me":
        review_license(store, release.id, by=person(ME))
        review_code(store, release.id, by=person(ME))
    else:
        k3a_as(second_user, store, "review", "license", release.id, env=k3a_env)
        k3a_as(second_user, store, "review", "code", release.id, env=k3a_env)

    box: list = []
    thread = _answer_with_k3a(store, second_user, k3a_env, box)
    state = promote_release(tuple_id=release.id, channel="staging", store_url=store.url,
                            requested_by="bob", reason="typed as bob", poll_interval=1,
                            approval_timeout=120, return_state=True)
    thread.join(30)
    assert len(box) == 1 and not isinstance(box[0], Exception), box
    if reviewer == "second":
        assert state.is_failed() and state.name == "Blocked by gate", state
        assert f"{second_user} reviewed the license" in state.message
        assert read_state(store, "staging").pointer is None
    else:
        assert state.is_completed(), state
        (entry,) = history(store, "staging")
        assert (entry.approval.who, entry.approval.who_source) == (second_user, "key")
        assert entry.who == ME  # the flow's own identity moved it, on that approval
        dutied = next(g for g in entry.gates if g.name == "separation_of_duties")
        assert dutied.passed and second_user in dutied.reason and "bob" not in dutied.reason
