"""Process death: ``kill -9`` of a real ``k3a stage`` at chosen points, then a re-run.

Between the kill and the re-run no reader may see any part of the revision; the re-run must
complete and fetch again only what was not verified before the kill (the hub's request log
says which files and byte ranges were fetched).
"""

from __future__ import annotations

import pytest

from k3artifacts.stores.verify import verify_revision
from tests.faults.faultkit import (
    SHARD1,
    assert_not_visible,
    file_gets,
    quarantine_of,
    stage_args,
    start_k3a,
    verified_paths,
)
from tests.staging_helpers import REPO, small_release
from tests.support.cli import run_process
from tests.support.hubfaults import Fault
from tests.support.waiting import wait_until

pytestmark = pytest.mark.faults

STALL_AT = 100_000


@pytest.fixture
def release(local_hub, tmp_path):
    files = small_release(tmp_path)
    # A nested path: publication makes its directory read-only, which a re-run must undo.
    files["tokenizer/tokenizer_config.json"] = b'{"model_max_length": 1048576}'
    return local_hub.hub.add_commit(REPO, files)


@pytest.fixture
def k3a(k3a_unprivileged):
    return k3a_unprivileged


def rerun_and_check(local_hub, file_store, quarantine, k3a, k3a_env, commit):
    mark = len(local_hub.hub.requests)
    done = run_process(*stage_args(local_hub.endpoint, file_store, quarantine),
                       env=k3a_env, cmd=k3a, expect=None)
    assert done.returncode == 0, done.stderr
    assert f"published {len(local_hub.hub.files(REPO))} files" in done.stdout
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok
    return file_gets(local_hub.hub, mark)


def test_kill_mid_download_resumes_partial_file(local_hub, file_store, tmp_path, release,
                                                k3a, k3a_env):
    commit, quarantine = release, tmp_path / "quarantine"
    part = quarantine_of(quarantine, commit).part_path(SHARD1)
    local_hub.hub.faults.add(SHARD1, Fault.stall(60, after_bytes=STALL_AT))
    run = start_k3a(k3a, k3a_env, *stage_args(local_hub.endpoint, file_store, quarantine))
    # The shard is stalled after STALL_AT bytes (at most one write buffer of them still in the
    # process) and every other file is verified: the kill lands mid-download.
    wait_until(lambda: part.exists() and part.stat().st_size >= STALL_AT - 8192,
               "the partial shard to reach the stall", proc=run.proc)
    others = len(local_hub.hub.files(REPO)) - 1
    wait_until(lambda: len(verified_paths(quarantine, commit)) == others,
               "the other files to verify", proc=run.proc)
    run.kill9()

    assert_not_visible(file_store, commit)
    kept = part.stat().st_size
    assert 0 < kept <= STALL_AT

    gets = rerun_and_check(local_hub, file_store, quarantine, k3a, k3a_env, commit)
    assert [(g.target, g.range) for g in gets] == [(SHARD1, f"bytes={kept}-")]


def test_kill_after_download_before_checks_reuses_complete_file(local_hub, file_store, tmp_path,
                                                                release, k3a, k3a_env):
    commit, quarantine = release, tmp_path / "quarantine"
    run = start_k3a(k3a, k3a_env, *stage_args(local_hub.endpoint, file_store, quarantine),
                    K3A_FAULT_PAUSE=f"downloaded@{SHARD1}:60")
    run.wait_line(f"paused at downloaded {SHARD1}")
    others = len(local_hub.hub.files(REPO)) - 1
    wait_until(lambda: len(verified_paths(quarantine, commit)) == others,
               "the other files to verify", proc=run.proc)
    run.kill9()

    assert_not_visible(file_store, commit)
    part = quarantine_of(quarantine, commit).part_path(SHARD1)
    assert part.stat().st_size == local_hub.hub.files(REPO)[SHARD1].size

    # Every byte is on disk already: the re-run checks the file and fetches nothing.
    assert rerun_and_check(local_hub, file_store, quarantine, k3a, k3a_env, commit) == []


def test_kill_mid_publish_leaves_nothing_visible(local_hub, file_store, tmp_path, release,
                                                 k3a, k3a_env):
    commit, quarantine = release, tmp_path / "quarantine"
    run = start_k3a(k3a, k3a_env, *stage_args(local_hub.endpoint, file_store, quarantine),
                    K3A_FAULT_PAUSE="publish:60")
    run.wait_line("paused at publish")
    run.kill9()

    # The hidden staging directory holds every file and the manifest; readers see none of it.
    assert_not_visible(file_store, commit)
    not_yet = run_process("verify", f"{REPO}@{commit}", "--store", file_store.url,
                          env=k3a_env, cmd=k3a, expect=None)
    assert not_yet.returncode == 7, not_yet.stderr
    assert "not published" in not_yet.stderr

    assert rerun_and_check(local_hub, file_store, quarantine, k3a, k3a_env, commit) == []
    assert not quarantine_of(quarantine, commit).dir.exists()
