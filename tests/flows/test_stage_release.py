"""stage-release end to end: real Prefect API, real huggingface_hub against the local hub."""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from flows.stage_release import stage_release
from k3artifacts.stores.verify import verify_revision
from tests.flow_helpers import resolve_gets
from tests.staging_helpers import REPO, small_release
from tests.support.hubfaults import Fault

SHARD = "model-00001-of-00002.safetensors"
FAST = {"attempts": 2, "backoff": 0.01, "task_retries": 1, "task_retry_delay": 0}


def run(local_hub, store, tmp_path, **kw):
    params = {"repo_id": REPO, "revision": "main", "store_url": store.url,
              "quarantine": str(tmp_path / "quarantine"), "endpoint": local_hub.endpoint} | FAST
    return stage_release(**(params | kw), return_state=True)


def artifacts_of(state):
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    # By what the key ends in: status, progress, files, summary, plan (the no-op note has no key).
    return {(a.key or "note").rsplit("-", 1)[-1]: a for a in found}


def test_stage_flow_publishes_with_artifacts(local_hub, file_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    state = run(local_hub, file_store, tmp_path)

    assert state.is_completed(), state
    summary = state.result()
    manifest = file_store.read_manifest(REPO, commit)
    assert summary["commit"] == commit and summary["manifest_digest"] == manifest.digest()
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok
    assert sorted(resolve_gets(local_hub.hub)) == sorted(f.path for f in manifest.files)

    arts = artifacts_of(state)
    assert set(arts) == {"plan", "status", "progress", "files", "summary"}
    rows = _table(arts)
    assert {r["path"]: (r["sha256"], r["state"]) for r in rows} == {
        f.path: (f"sha256:{f.sha256}", "verified") for f in manifest.files}
    assert f"sha256:{manifest.digest()}" in arts["summary"].data
    assert "modeling_kimi_k3.py" in arts["summary"].data
    assert float(arts["progress"].data) == 100.0

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(
            f"k3a-stage-moonshotai--kimi-k3-{commit}")
    assert limit.limit == 1 and limit.active_slots == 0

    before = len(local_hub.hub.requests)
    again = run(local_hub, file_store, tmp_path)
    assert again.is_completed() and again.result()["already_published"]
    assert resolve_gets(local_hub.hub, before) == []


def test_rerun_after_network_failure_fetches_only_the_failed_file(local_hub, file_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add(SHARD, Fault.http_status(500, times=None))
    failed = run(local_hub, file_store, tmp_path)

    assert failed.is_failed()
    assert file_store.list_revisions(REPO) == []
    # attempts=2 inside the task, and the task retried once on Unavailable: 4 GETs.
    assert resolve_gets(local_hub.hub).count(SHARD) == 4
    rows = {r["path"]: r["state"] for r in _table(artifacts_of(failed))}
    assert rows[SHARD].startswith("failed: Unavailable")
    assert {s for p, s in rows.items() if p != SHARD} == {"verified"}

    local_hub.hub.faults.clear()
    before = len(local_hub.hub.requests)
    state = run(local_hub, file_store, tmp_path)
    assert state.is_completed(), state
    assert resolve_gets(local_hub.hub, before) == [SHARD]
    assert state.result()["reused_files"] == len(rows) - 1
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok


def test_refused_file_is_not_retried_and_nothing_is_published(local_hub, file_store, tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add(SHARD, Fault.corrupt(offset=4096))
    state = run(local_hub, file_store, tmp_path)

    assert state.is_failed()
    assert "sha256" in state.message or "refused" in state.message
    assert resolve_gets(local_hub.hub).count(SHARD) == 1
    assert file_store.list_revisions(REPO) == [] and file_store.list_keys("models/") == []
    rows = {r["path"]: r["state"] for r in _table(artifacts_of(state))}
    assert rows[SHARD].startswith("refused: sha256")


def _table(arts, kind="files"):
    import json

    data = arts[kind].data
    return json.loads(data) if isinstance(data, str) else data


def test_incremental_revision_shows_its_plan_and_pulls_only_the_change(local_hub, file_store,
                                                                       tmp_path):
    files = small_release(tmp_path)
    first = local_hub.hub.add_commit(REPO, files)
    assert run(local_hub, file_store, tmp_path).is_completed()
    second = local_hub.hub.add_commit(REPO, {**files, "config.json": b'{"v": 2}'})
    before = len(local_hub.hub.requests)
    state = run(local_hub, file_store, tmp_path)

    assert state.is_completed(), state
    assert resolve_gets(local_hub.hub, before) == ["config.json"]
    summary = state.result()
    assert summary["commit"] == second and summary["downloaded_bytes"] == len(b'{"v": 2}')
    plan = {r["path"]: (r["action"], r["from"]) for r in _table(artifacts_of(state), "plan")}
    assert plan["config.json"] == ("download", "")
    assert plan[SHARD] == ("reuse", f"{first[:12]}:{SHARD}")
    assert plan["TOTAL download"] == ("download", "1 file(s)")
    assert plan["TOTAL reuse"] == ("reuse", f"{len(files) - 1} file(s)")
    rows = {r["path"]: r["state"] for r in _table(artifacts_of(state))}
    assert rows == {p: "verified" if p == "config.json" else f"reused from {first[:12]}"
                    for p in files}
    assert verify_revision(store=file_store, repo_id=REPO, commit=second, full=True).ok


def test_stage_flow_makes_the_release_tuple(local_hub, file_store, tmp_path, oci_registry):
    from k3artifacts.releases.tuples import TupleStore

    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    pushed = oci_registry.push("k3a/vllm", "k3-flow")
    state = run(local_hub, file_store, tmp_path, image=f"{oci_registry.host}/k3a/vllm:k3-flow",
                profile="p6-b300-tp8")
    assert state.is_completed(), state
    release = TupleStore(file_store).get(state.result()["tuple_id"])
    assert release.binding.weights.commit == commit
    assert release.binding.image.digest == pushed.digest
    assert release.id in artifacts_of(state)["summary"].data


def test_a_stream_count_below_one_is_refused_before_any_file_moves(local_hub, file_store,
                                                                   tmp_path):
    from k3artifacts.errors import ConfigError

    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    state = run(local_hub, file_store, tmp_path, streams=0)
    assert state.is_failed()
    err = state.result(raise_on_failure=False)
    assert isinstance(err, ConfigError) and "0 streams" in str(err), err
    assert resolve_gets(local_hub.hub) == []
