"""What promote and rollback runs leave in the Prefect UI: named decisions, complete records,
names and tags, an approval request that informs (read back through the API)."""

from __future__ import annotations

import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.logging.handlers import APILogWorker

from flows.promote import promote_release
from flows.rollback import rollback_channel
from k3artifacts.releases.channels import history
from k3artifacts.stores.file import FileStore
from tests.flow_helpers import answer_when_requested, run_answered


@pytest.fixture
def store(tmp_path):
    return FileStore(tmp_path / "store")


def run_of(state):
    APILogWorker.drain_all(timeout=10)
    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return run, {a.key: a for a in arts}, [log.message for log in logs]


def test_gate_refusal_is_a_named_decision_without_traceback(store, releases, policies):
    release = releases.release()  # license and remote code never reviewed
    state = promote_release(tuple_id=release.id, channel="staging", store_url=store.url,
                            requested_by="ci", reason="nightly",
                            return_state=True)
    assert state.is_failed() and state.name == "Blocked by gate"
    assert "license" in state.message and "next:" in state.message

    run, arts, logs = run_of(state)
    assert run.state.name == "Blocked by gate"
    assert not any("Traceback" in m for m in logs), logs
    (decision,) = [m for m in logs if m.startswith("Blocked by gate:")]
    assert "license" in decision and "\n" not in decision
    refused = arts["k3a-promote-staging-refused"]
    assert "blocked by gate" in refused.data and "**FAIL**" in refused.data
    assert "license" in refused.data and refused.description
    assert "k3a-promote-staging" not in arts  # the channel's record key holds moves only


def test_internal_errors_still_show_their_traceback(store, releases, policies):
    state = promote_release(tuple_id="k3t-" + "0" * 24, channel="staging", store_url=store.url,
                            return_state=True)
    assert state.is_failed() and state.name == "Failed"
    _, _, logs = run_of(state)
    assert any("Traceback" in m for m in logs)


def test_promote_and_rollback_records_are_complete(store, releases, policies, reviewed):
    first, second = releases.release(), releases.release()
    for r in (first, second):
        reviewed(r)
    states = [
        run_answered(promote_release,
                     {"decision": "approve", "reviewer": "alice", "reason": "evals look fine"},
                     tuple_id=r.id, channel="staging", store_url=store.url,
                     requested_by="ci", reason="nightly candidate")
        for r in (first, second)
    ]
    back = run_answered(rollback_channel,
                        {"decision": "approve", "reviewer": "carol", "reason": "confirmed p99"},
                        channel="staging", store_url=store.url,
                        requested_by="oncall", reason="p99 latency up", require_approval=True)
    assert all(s.is_completed() for s in [*states, back])
    seqs = [e.seq for e in history(store, "staging")]

    def facts(release):
        w, image = release.binding.weights, release.binding.image
        return [f"{w.repo_id}@{w.commit}", f"sha256:{w.manifest_digest}", image.digest,
                image.reference, release.binding.serving.profile]

    run, arts, logs = run_of(states[1])
    record = arts["k3a-promote-staging"]
    outcome = next(m for m in logs if m.startswith("promote staging moved"))
    for text in (record.data, outcome):
        for fact in ["ci", "nightly candidate", "alice", "evals look fine", f"#{seqs[1]}",
                     *facts(first), *facts(second), "license", "pass"]:
            assert fact in text, fact
    assert record.description and "promotion" in record.description
    assert run.name == f"promote {second.id} -> staging"
    w = second.binding.weights
    assert {f"tuple:{second.id}", "channel:staging", f"repo:{w.repo_id}",
            f"commit:{w.commit}"} <= set(run.tags)

    run, arts, logs = run_of(back)
    record = arts["k3a-rollback-staging"]
    outcome = next(m for m in logs if m.startswith("rollback staging moved"))
    for text in (record.data, outcome):
        for fact in ["oncall", "p99 latency up", "carol", "confirmed p99", f"#{seqs[2]}",
                     "weights_present", *facts(first), *facts(second)]:
            assert fact in text, fact
    assert record.description and "rollback" in record.description
    assert run.name == "rollback staging"
    w = first.binding.weights
    assert {f"tuple:{first.id}", "channel:staging", f"repo:{w.repo_id}",
            f"commit:{w.commit}"} <= set(run.tags)


def test_approval_request_informs_and_names_the_command_that_answers_it(store, releases,
                                                                        policies, reviewed):
    serving, candidate = releases.release(), releases.release()
    for r in (serving, candidate):
        reviewed(r)
    run_answered(promote_release, {"decision": "approve", "reviewer": "a", "reason": ""},
                 tuple_id=serving.id, channel="staging", store_url=store.url)
    seen: dict = {}
    thread, outcome = answer_when_requested(store.url, {"decision": "reject", "reviewer": "bob"},
                                            before=lambda request: seen.update(request=request))
    state = promote_release(tuple_id=candidate.id, channel="staging", store_url=store.url,
                            requested_by="ci", reason="nightly", poll_interval=1,
                            return_state=True)
    thread.join(30)
    assert outcome == [seen["request"].id] and state.name == "Rejected"
    assert "rejected by bob" in state.message

    # What the run shows the approver, read back from the API: the move, both sides of it,
    # and the command to answer it with, under their own identity.
    _, arts, _ = run_of(state)
    text = arts["k3a-promote-staging-approval"].data
    for r in (serving, candidate):
        w = r.binding.weights
        for fact in (r.id, w.commit, r.binding.image.reference, r.binding.serving.profile):
            assert fact in text, fact
    assert "Serving now" in text and "Would replace it" in text and "license: `sha256:" in text
    assert f"k3a approve {seen['request'].id}" in text
    assert "| " not in text  # lists, not tables: nothing cut off in a narrow pane
    assert seen["request"].requested_for == "ci"  # shown as typed, not an identity


def test_a_lost_race_is_a_named_decision(store, releases, policies, reviewed, prefect_api,
                                         tmp_path):
    """The rollback runs in a subprocess held at the channel's compare-and-swap (a named
    fault point) while this process moves the channel; let go, it loses the race."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.fixtures.moves import promote

    first, second, third = (releases.release() for _ in range(3))
    for r in (first, second, third):
        reviewed(r)
    for r in (first, second):
        promote(store, r.id, "staging", actor="ci", policies_dir=policies)
    resume = tmp_path / "resume"
    script = (
        "import json\n"
        "from flows.rollback import rollback_channel\n"
        f"s = rollback_channel(channel='staging', store_url={store.url!r}, "
        "requested_by='oncall', reason='p99 up', "
        "return_state=True)\n"
        "print('STATE ' + json.dumps([s.name, s.message, str(s.state_details.flow_run_id)]))\n"
    )
    env = os.environ | {"PREFECT_API_URL": prefect_api, "K3A_FAULT_RESUME": str(resume),
                        "K3A_FAULT_PAUSE": "channel-move@staging:120"}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            if "k3a: paused at channel-move staging" in line:
                break
            assert time.monotonic() < deadline
        promote(store, third.id, "staging", actor="someone-else", policies_dir=policies)
        resume.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    (line,) = [x for x in out.splitlines() if x.startswith("STATE ")]
    import json
    name, message, run_id = json.loads(line[len("STATE "):])
    assert name == "Lost race" and third.id in message and "nothing was written" in message
    assert history(store, "staging")[-1].tuple_id == third.id

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(uuid.UUID(run_id))
        logs = [log.message for log in client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))]
    assert run.state.is_failed() and run.state.name == "Lost race"
    assert not any("Traceback" in m for m in logs), logs
    assert [m for m in logs if m.startswith("Lost race:")]
