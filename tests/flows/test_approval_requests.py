"""`k3a promote|rollback --request-approval` and the promote and rollback flows record the same
approval request for the same move, field for field (one builder, promotion/requests.py):
only the id and the time it was asked differ."""

from __future__ import annotations

import json
import subprocess

import pytest

from flows.promote import promote_release
from flows.rollback import rollback_channel
from k3artifacts.policy.approvals import ApprovalRequest, get_request
from k3artifacts.stores.file import FileStore
from tests.fixtures.moves import promote
from tests.flow_helpers import answer_when_requested


@pytest.fixture
def store(tmp_path):
    return FileStore(tmp_path / "store")


def _asked_by_the_flow(flow_fn, store, **params) -> ApprovalRequest:
    """The request the flow records, answered with a rejection (nothing moves)."""
    seen: dict = {}
    thread, outcome = answer_when_requested(store.url, {"decision": "reject", "reviewer": "bob"},
                                            before=lambda request: seen.update(request=request))
    state = flow_fn(store_url=store.url, poll_interval=1, return_state=True, **params)
    thread.join(30)
    assert state.name == "Rejected", state
    assert outcome == [seen["request"].id]
    return seen["request"]


def _asked_by_k3a(store, k3a_cmd, k3a_env, *args: str) -> ApprovalRequest:
    run = subprocess.run([*k3a_cmd, *args, "--request-approval", "--json", "--store", store.url],
                         env=k3a_env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return get_request(store, json.loads(run.stdout)["id"])


def _fields(request: ApprovalRequest) -> dict:
    return request.model_dump(mode="json", exclude={"id", "requested_at"})


def test_a_promotion_request_is_the_same_from_k3a_and_the_flow(store, releases, policies,
                                                               reviewed, k3a_cmd, k3a_env):
    serving, candidate = releases.release(), releases.release()
    for r in (serving, candidate):
        reviewed(r)
    promote(store, serving.id, "staging", actor="ci", policies_dir=policies)
    flow = _asked_by_the_flow(promote_release, store, tuple_id=candidate.id, channel="staging",
                              reason="nightly")
    cli = _asked_by_k3a(store, k3a_cmd, k3a_env, "promote", candidate.id, "staging",
                        "--why", "nightly")
    assert cli.id != flow.id and _fields(cli) == _fields(flow)
    assert (cli.action, cli.channel, cli.tuple_id, cli.why) == (
        "promote", "staging", candidate.id, "nightly")
    assert cli.policy_digest is not None


def test_a_rollback_request_is_the_same_from_k3a_and_the_flow(store, releases, policies,
                                                              reviewed, k3a_cmd, k3a_env):
    first, second = releases.release(), releases.release()
    for r in (first, second):
        reviewed(r)
        promote(store, r.id, "staging", actor="ci", policies_dir=policies)
    flow = _asked_by_the_flow(rollback_channel, store, channel="staging", reason="p99 up",
                              require_approval=True)
    cli = _asked_by_k3a(store, k3a_cmd, k3a_env, "rollback", "staging", "--why", "p99 up")
    assert cli.id != flow.id and _fields(cli) == _fields(flow)
    # The target is decided once, by the library, for both: the previous tuple.
    assert (cli.action, cli.channel, cli.tuple_id) == ("rollback", "staging", first.id)
