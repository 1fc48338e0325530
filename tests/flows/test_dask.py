"""Per-file tasks fanned out to a Dask cluster (a local 2-worker one here)."""

from __future__ import annotations

import pytest
from distributed import LocalCluster
from prefect_dask import DaskTaskRunner

from flows.stage_release import stage_release
from k3artifacts.stores.verify import verify_revision
from tests.flow_helpers import resolve_gets
from tests.staging_helpers import REPO, small_release


@pytest.fixture(params=[
    pytest.param(False, id="threads"),
    # Worker processes: the tasks run where the flow's revision lock and objects are not, as on
    # a real cluster; only the shared quarantine directory and the store connect them. Slow
    # here (~40 s on 2 busy cores: two interpreters importing Prefect), hence marked.
    pytest.param(True, id="processes", marks=pytest.mark.slow),
])
def dask_cluster(request):
    # In-process workers talk over inproc://; worker processes over TCP on loopback.
    network = {"host": "127.0.0.1"} if request.param else {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=request.param,
                      dashboard_address=None, **network) as cluster:
        yield cluster


def test_stage_on_dask_workers(local_hub, file_store, tmp_path, dask_cluster):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    flow = stage_release.with_options(task_runner=DaskTaskRunner(address=dask_cluster.scheduler_address))
    state = flow(repo_id=REPO, revision="main", store_url=file_store.url,
                 quarantine=str(tmp_path / "quarantine"), endpoint=local_hub.endpoint,
                 return_state=True)
    assert state.is_completed(), state
    manifest = file_store.read_manifest(REPO, commit)
    assert sorted(resolve_gets(local_hub.hub)) == sorted(f.path for f in manifest.files)
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok
