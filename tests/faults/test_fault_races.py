"""Release-state races: two stagings of one revision, tuple writes with the same id, movers of
one channel. Outcome: exactly one winner, a complete history, nothing overwritten.

The promotion-versus-promotion and promotion-versus-rollback races with a barrier in front of
the compare-and-swap are in tests/test_promotion.py and tests/test_channels_cli.py (see the
README table); here they run as separate ``k3a`` processes and through a store that loses
answers.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from k3artifacts.releases.binding import create_tuple
from k3artifacts.releases.channels import current, history, history_key
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.releases.tuples import ImageRef, TupleStore, tuple_key
from k3artifacts.serving.profiles import load_profile, serving_spec
from k3artifacts.stores.s3 import S3Store
from k3artifacts.stores.verify import verify_revision
from tests.faults.faultkit import (
    stage_args,
    start_k3a,
)
from tests.fixtures.moves import promote, use_policy
from tests.fixtures.people import person
from tests.staging_helpers import REPO, small_release
from tests.support.cli import run_process
from tests.support.releases import REPO_ID, Releases
from tests.support.waiting import wait_until

pytestmark = pytest.mark.faults


def waiting_on_a_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked in flock() (the kernel lists it with ``->``)."""
    with open("/proc/locks") as fh:
        return any(f" {pid} " in line for line in fh if "->" in line)


def test_two_stagings_of_one_revision_into_one_file_store(local_hub, file_store, tmp_path,
                                                          k3a_cmd, k3a_env):
    """Two workers (own quarantines) stage the same revision onto one FSx tree; the first is
    held inside its publication while the second runs. Both succeed, the revision is published
    once, whole, and nothing of either run is left beside it."""
    files = small_release(tmp_path)
    files["tokenizer/tokenizer_config.json"] = b"{}"
    commit = local_hub.hub.add_commit(REPO, files)
    go = tmp_path / "go"
    first = start_k3a(k3a_cmd, k3a_env,
                      *stage_args(local_hub.endpoint, file_store, tmp_path / "q1"),
                      K3A_FAULT_PAUSE="publish:60", K3A_FAULT_RESUME=str(go))
    first.wait_line("paused at publish")
    second = start_k3a(k3a_cmd, k3a_env,
                       *stage_args(local_hub.endpoint, file_store, tmp_path / "q2"))
    wait_until(lambda: second.proc.poll() is not None or waiting_on_a_lock(second.proc.pid),
               "the second staging to finish or wait for the first")
    go.touch()

    assert first.finish() == 0, first.stderr
    assert second.finish() == 0, second.stderr
    assert file_store.list_revisions(REPO) == [commit]
    assert verify_revision(store=file_store, repo_id=REPO, commit=commit, full=True).ok
    beside = sorted(p.name for p in (file_store.root / "models" / REPO).iterdir()
                    if not p.name.endswith(".lock"))
    assert beside == [commit]


def test_tuple_writes_racing_with_the_same_id(published_revision):
    """Sixteen writers bind the same inputs at once (a retried flow, two operators): one record
    is written, every writer gets the same id, the first record is never overwritten."""
    p = published_revision
    spec = serving_spec(load_profile("p6-b300-tp8"))
    image = ImageRef(repository="registry.example.com/vllm", digest="sha256:" + "1" * 64)
    barrier = threading.Barrier(16)

    def write(i: int):
        barrier.wait()
        return create_tuple(p.store, p.repo_id, p.commit, image, spec, created_by=f"writer-{i}")

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(write, range(16)))
    assert len({r.release.id for r in results}) == 1
    winners = [r for r in results if r.new]
    assert len(winners) == 1
    key = tuple_key(results[0].release.id)
    stored = p.store.local_path(key)
    before = stored.stat()
    assert TupleStore(p.store).get(results[0].release.id).created_by == winners[0].release.created_by
    create_tuple(p.store, p.repo_id, p.commit, image, spec, created_by="late")
    after = stored.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert TupleStore(p.store).list_ids() == [results[0].release.id]


@pytest.mark.s3
def test_lost_answers_to_tuple_and_channel_writes_on_s3(s3_fault_proxy, s3_url, tmp_path,
                                                        policies):
    """S3 applied the conditional write but its answer was lost; boto3 retries and gets 412.
    The tuple write and the move must still count as done, and the history stay complete."""
    proxy = s3_fault_proxy
    store = S3Store.from_url(s3_url, endpoint_url=proxy.endpoint)
    releases = Releases(store, tmp_path / "scratch")
    first, second = releases.publish(), releases.publish()
    spec = serving_spec(load_profile("p6-b300-tp8"))
    image = ImageRef(repository="registry.example.com/vllm", digest="sha256:" + "1" * 64)

    proxy.add("PutObject", "*/releases/tuples/*", action="lose")
    made = create_tuple(store, REPO_ID, first.commit, image, spec)
    assert [r.status for r in proxy.ops("PutObject") if "/releases/tuples/" in r.key] == [500, 412]
    assert TupleStore(store).list_ids() == [made.release.id]
    old = made.release
    new = create_tuple(store, REPO_ID, second.commit, image, spec).release
    use_policy(store, policies)  # the reviews are read through the identities it names
    for release in (old, new):
        review_license(store, release.id, by=person("alice"))
        review_code(store, release.id, by=person("alice"))

    proxy.add("PutObject", "*/releases/channels/staging.json", action="lose")
    moved = promote(store, old.id, "staging", actor="alice", policies_dir=policies)
    assert moved.tuple_id == old.id
    assert current(store, "staging").tuple_id == old.id
    assert [e.tuple_id for e in history(store, "staging")] == [old.id]

    promote(store, new.id, "staging", actor="alice", policies_dir=policies)
    entries = history(store, "staging")
    assert [(e.seq, e.tuple_id, e.previous_tuple_id) for e in entries] == [
        (1, old.id, None), (2, new.id, old.id)]
    assert store.read(history_key("staging", 1)) is not None


def test_two_stagings_of_one_revision_sharing_a_quarantine(local_hub, file_store, tmp_path,
                                                          k3a_cmd, k3a_env):
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    quarantine, go = tmp_path / "q", tmp_path / "go"
    args = stage_args(local_hub.endpoint, file_store, quarantine)
    first = start_k3a(k3a_cmd, k3a_env, *args,
                      K3A_FAULT_PAUSE="publish:60", K3A_FAULT_RESUME=str(go))
    first.wait_line("paused at publish")
    second = run_process(*args, env=k3a_env, cmd=k3a_cmd, expect=None)
    assert second.returncode == 6, second.stderr
    assert "another k3a process is staging this revision" in second.stderr
    go.touch()
    assert first.finish() == 0, first.stderr
    assert file_store.list_revisions(REPO) == [commit]
