"""promote and rollback smoke the endpoint serving the tuple before declaring success, against
the OpenAI-compatible fixture server on loopback, and show the report as an artifact."""

from __future__ import annotations

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)

from flows.promote import promote_release
from flows.rollback import rollback_channel
from k3artifacts.releases.channels import current, read_state
from k3artifacts.releases.evaluations import list_evaluations
from k3artifacts.serving.render.common import served_names
from k3artifacts.stores.file import FileStore
from tests.fixtures.moves import promote
from tests.flow_helpers import answer_when_requested
from tests.support.openai_server import start
from tests.support.ports import free_ports


@pytest.fixture
def store(tmp_path):
    return FileStore(tmp_path / "store")


@pytest.fixture
def server(tmp_path):
    started = []

    def run(name: str, **faults):
        started.append(start(name, tmp_path / f"openai-{len(started)}.log", **faults))
        return started[-1]

    yield run
    for s in started:
        s.stop()


def smoke_artifact(state, channel: str) -> str:
    with get_client(sync_client=True) as client:
        (found,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[f"k3a-smoke-{channel}"]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    return found.data


def test_promote_smokes_the_endpoint_before_asking_for_approval(store, releases, policies,
                                                                reviewed, server):
    release = releases.release()
    reviewed(release)
    s = server(served_names(release))
    thread, outcome = answer_when_requested(store.url, {"decision": "approve",
                                                        "reviewer": "alice"})
    state = promote_release(tuple_id=release.id, channel="staging", store_url=store.url,
                            endpoint=s.url, poll_interval=1, return_state=True)
    thread.join(30)
    assert state.is_completed(), state
    assert current(store, "staging").tuple_id == release.id
    (record,) = list_evaluations(store, release.id)
    assert record.origin == "run" and record.readiness().kind == "smoke"
    md = smoke_artifact(state, "staging")
    assert f"# smoke of {release.id}: ready" in md and "| sweep | pass |" in md
    assert "Latency against concurrency" in md


def test_promote_with_an_endpoint_serving_another_model_fails_and_moves_nothing(
    store, releases, policies, reviewed, server
):
    release = releases.release()
    reviewed(release)
    s = server("some-other-model")
    state = promote_release(tuple_id=release.id, channel="staging", store_url=store.url,
                            endpoint=s.url, return_state=True)
    assert state.is_failed() and "models: serves ['some-other-model']" in state.message
    assert read_state(store, "staging").pointer is None
    assert "NOT READY" in smoke_artifact(state, "staging")


def test_rollback_fails_when_the_endpoint_is_not_ready(store, releases, policies, reviewed):
    first, second = releases.release(), releases.release()
    for r in (first, second):
        reviewed(r)
        promote(store, r.id, "staging", actor="ci", policies_dir=policies)
    (port,) = free_ports(1)
    state = rollback_channel(channel="staging", store_url=store.url,
                             endpoint=f"http://127.0.0.1:{port}", return_state=True)
    assert state.is_failed() and "connection refused" in state.message
    assert "keep traffic closed" not in state.message  # the hint is the CLI's, not the message
    assert current(store, "staging").tuple_id == first.id  # moved; traffic stays closed
