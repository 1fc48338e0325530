"""What a release engineer sees of a staging run in the Prefect UI while it runs and after.

The flow runs in this thread against the session's Prefect API; a second thread reads the
run's artifacts through the API as the UI would, while a slowed local hub keeps the run long.
"""

from __future__ import annotations

import contextvars
import json
import re
import threading
import time

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.sorting import ArtifactSort
from prefect.logging.handlers import APILogWorker

from flows.common import slug
from flows.stage_release import stage_release
from tests.staging_helpers import REPO, small_release
from tests.support.hubfaults import Fault

# Artifact keys name the commit, and a release's commit derives from its bytes: each test
# stages its own seed, so no test reads another's artifacts from the session's API.
FAST = {"attempts": 2, "backoff": 0.01, "task_retries": 1, "task_retry_delay": 0}
BYTES = re.compile(r"\(([\d,]+) of ([\d,]+) bytes\)")


class Watcher:
    """Polls the artifacts under ``keys`` and keeps every distinct version of their data, with
    what ``probe()`` said just before the read."""

    def __init__(self, keys: list[str], probe):
        self.keys = keys
        self.probe = probe
        self.seen: dict[str, list[tuple[float, object, object]]] = {k: [] for k in keys}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=contextvars.copy_context().run,
                                       args=(self._poll,), daemon=True)

    def _poll(self) -> None:
        with get_client(sync_client=True) as client:
            while not self.stop.is_set():
                before = self.probe()
                for art in client.read_artifacts(
                        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=self.keys))):
                    versions = self.seen[art.key]
                    if not versions or versions[-1][1] != art.data:
                        versions.append((time.monotonic(), art.data, before))
                time.sleep(0.1)

    def __enter__(self) -> Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


def _rows(data) -> list[dict]:
    return json.loads(data) if isinstance(data, str) else data


def test_progress_and_files_are_live_while_a_slow_stage_runs(local_hub, file_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path, seed=1701))
    # Every file waits 1 s for its headers, so none finishes before then; each shard then
    # pauses three times mid-body, so the byte count grows in steps the ticker can see.
    local_hub.hub.faults.add("*", Fault.stall(1.0, times=None))
    for at in (64 << 10, 128 << 10, 192 << 10):
        local_hub.hub.faults.add("*.safetensors", Fault.stall(0.6, after_bytes=at, times=None))
    key = slug("k3a", REPO, commit[:12])
    keys = [f"{key}-status", f"{key}-files", f"{key}-summary"]

    def verified_files() -> int:
        # A file moves from partial/ to files/ in the quarantine once it verifies.
        return sum(p.is_file() for p in (tmp_path / "q").glob("*/*/files/**/*"))

    with Watcher(keys, verified_files) as watch:
        state = stage_release(repo_id=REPO, store_url=file_store.url, endpoint=local_hub.endpoint,
                              quarantine=str(tmp_path / "q"), keep_quarantine=True,
                              progress_interval=0.3,
                              return_state=True, **FAST)
        ended = time.monotonic()
    assert state.is_completed(), state

    files = watch.seen[f"{key}-files"]
    assert files, "no files table while the run ran"
    _, first_rows, finished_before = files[0]
    assert finished_before == 0  # the table was there before any file had verified
    assert {r["state"] for r in _rows(first_rows)} <= {"planned", "downloading"}
    assert {r["planned"] for r in _rows(first_rows)} == {"download"}
    assert {r["state"] for r in _rows(files[-1][1])} == {"verified"}
    assert verified_files() > 0  # the probe looks where the files really go

    statuses = [(t, d) for t, d, _ in watch.seen[f"{key}-status"] if t < ended]
    counts = [int(m.group(1).replace(",", "")) for _, d in statuses if (m := BYTES.search(d))]
    moving = sorted({c for c in counts if c > 0})
    total = int(BYTES.search(statuses[-1][1]).group(2).replace(",", ""))
    assert len([c for c in moving if c < total]) >= 2, counts  # grew at least twice mid-run
    assert counts == sorted(counts)
    last = statuses[-1][1]
    for word in ("rate", "ETA", "files", "/s"):
        assert word in last
    assert "published" in watch.seen[f"{key}-status"][-1][1]

    summary = watch.seen[f"{key}-summary"][-1][1]
    for word in ("duration", "throughput", "k3a tuple create", "GiB" if total > 1 << 30 else "KiB"):
        assert word in summary, word
    assert "| |" not in summary  # a real header row, not an empty one


def test_runs_are_named_and_tagged_and_a_noop_rerun_keeps_the_real_summary(
        local_hub, file_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path, seed=1702))
    params = {"repo_id": REPO, "store_url": file_store.url, "endpoint": local_hub.endpoint,
              "quarantine": str(tmp_path / "q")} | FAST
    first = stage_release(**params, return_state=True)
    again = stage_release(**params, return_state=True)
    assert first.is_completed() and again.is_completed()

    key = slug("k3a", REPO, commit[:12], "summary")
    with get_client(sync_client=True) as client:
        runs = [client.read_flow_run(s.state_details.flow_run_id) for s in (first, again)]
        latest = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        notes = [a for a in client.read_artifacts() if a.flow_run_id == runs[1].id]
    for run in runs:
        assert run.name == f"stage {REPO}@{commit[:7]}"
        assert {f"repo:{REPO}", f"commit:{commit}"} <= set(run.tags)
    (summary,) = latest
    assert summary.flow_run_id == runs[0].id and "already published" not in summary.data
    (note,) = notes
    assert note.key is None and "already published" in note.data and runs[0].name in note.data


def test_the_run_log_closes_with_the_result_not_task_boilerplate(local_hub, file_store, tmp_path):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path, seed=1703))
    state = stage_release(repo_id=REPO, store_url=file_store.url, endpoint=local_hub.endpoint,
                          quarantine=str(tmp_path / "q"), return_state=True, **FAST)
    assert state.is_completed()
    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    task_lines = [log.message for log in logs if log.task_run_id is not None]
    assert task_lines and not [m for m in task_lines if m.startswith("Finished in state")]
    (closing,) = [log.message for log in logs if log.message.startswith("published ")]
    for fact in (commit, f"sha256:{state.result()['manifest_digest']}", file_store.url.split("//")[-1],
                 "next: k3a tuple create"):
        assert fact in closing, fact


def test_the_files_table_says_which_file_resumed_and_which_were_reused(
        local_hub, file_store, tmp_path):
    shard = "model-00001-of-00002.safetensors"
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path, seed=1704))
    params = {"repo_id": REPO, "store_url": file_store.url, "endpoint": local_hub.endpoint,
              "quarantine": str(tmp_path / "q"), "attempts": 1, "backoff": 0.01,
              "task_retries": 0, "task_retry_delay": 0}
    local_hub.hub.faults.add(shard, Fault.drop(after_bytes=100 << 10, times=None))
    assert stage_release(**params, return_state=True).is_failed()
    local_hub.hub.faults.clear()
    state = stage_release(**params, return_state=True)
    assert state.is_completed(), state

    key = slug("k3a", REPO, commit[:12], "files")
    with get_client(sync_client=True) as client:
        (table,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key])), limit=1,
            sort=ArtifactSort.CREATED_DESC)
    rows = {r["path"]: r for r in _rows(table.data)}
    assert table.flow_run_id == state.state_details.flow_run_id
    assert rows[shard]["planned"] == "download"
    assert rows[shard]["state"].startswith("verified (resumed at 100.0 KiB")
    others = [r for p, r in rows.items() if p != shard]
    assert {r["planned"] for r in others} == {"reuse (verified earlier)"}
    assert {r["state"] for r in others} == {"reused"}
