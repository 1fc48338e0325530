"""watch-upstream: one staging run per new commit, none when nothing changed."""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

from flows.watch_upstream import commit_tag, watch_upstream
from tests.flow_helpers import resolve_gets
from tests.staging_helpers import REPO, small_release


def staging_runs(commit: str) -> list:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[commit_tag(REPO, commit)])))


def test_watcher_stages_a_new_commit_once(local_hub, file_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    params = {"repo_id": REPO, "store_url": file_store.url, "endpoint": local_hub.endpoint,
              "stage_parameters": {"quarantine": str(tmp_path / "q"), "attempts": 2,
                                   "backoff": 0.01}}

    first = watch_upstream(**params)
    assert [(a["commit"], a["action"]) for a in first] == [(commit, "staged: completed")]
    assert file_store.list_revisions(REPO) == [commit]
    runs = staging_runs(commit)
    assert len(runs) == 1 and runs[0].state.is_completed()

    before = len(local_hub.hub.requests)
    second = watch_upstream(**params)
    assert [(a["commit"], a["action"]) for a in second] == [(commit, "already staged")]
    assert len(staging_runs(commit)) == 1
    assert resolve_gets(local_hub.hub, before) == []


def test_watcher_skips_a_commit_whose_staging_is_unfinished(local_hub, file_store, tmp_path):
    from prefect.states import Running

    from flows.stage_release import stage_release

    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    with get_client(sync_client=True) as client:
        client.create_flow_run(stage_release, parameters={"revision": commit},
                               tags=[commit_tag(REPO, commit)], state=Running())
    actions = watch_upstream(repo_id=REPO, store_url=file_store.url, endpoint=local_hub.endpoint)
    assert len(actions) == 1 and actions[0]["action"].startswith("in progress: ")
    assert resolve_gets(local_hub.hub) == [] and file_store.list_revisions(REPO) == []
