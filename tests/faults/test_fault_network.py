"""Network faults injected by the local hub: dropped, refused, stalled, short and changed
answers. Retried where retrying is right, resumed from the partial file, refused with the file
named where the bytes are wrong; never published unverified."""

from __future__ import annotations

import pytest

from k3artifacts.errors import ReleaseRefused, Unavailable
from k3artifacts.localhub import Fault
from k3artifacts.staging.download import RetryPolicy
from k3artifacts.staging.engine import StageObserver, StageOptions, stage
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.verify import verify_revision
from tests.faults.faultkit import (
    SHARD1,
    assert_nothing_published,
    file_gets,
    quarantine_of,
)
from tests.staging_helpers import REPO, run_stage, small_release

pytestmark = pytest.mark.faults

CUT = 100_000


@pytest.fixture
def release(local_hub, tmp_path):
    return local_hub.hub.add_commit(REPO, small_release(tmp_path))


@pytest.fixture
def quarantine(tmp_path):
    return tmp_path / "quarantine"


def published(store, commit):
    assert verify_revision(store=store, repo_id=REPO, commit=commit, full=True).ok
    return True


def refusal(err: ReleaseRefused, path: str):
    found = [r for r in err.refusals if r.path == path]
    assert found, f"{path} is not named in: {err}"
    return found[0]


def test_dropped_connection_resumes_from_received_bytes(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add(SHARD1, Fault.drop(after_bytes=CUT))
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(local_hub.hub, path=SHARD1)] == [None, f"bytes={CUT}-"]
    assert published(file_store, release)


def test_short_body_with_full_content_length_resumes(local_hub, file_store, quarantine, release):
    size = local_hub.hub.files(REPO)[SHARD1].size
    local_hub.hub.faults.add(SHARD1, Fault.short(missing=10))
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(local_hub.hub, path=SHARD1)] == [None, f"bytes={size - 10}-"]
    assert published(file_store, release)


def test_stall_past_read_timeout_is_retried_and_resumed(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add(SHARD1, Fault.stall(5, after_bytes=CUT))
    run_stage(local_hub.endpoint, file_store, quarantine,
              retry=RetryPolicy(attempts=3, backoff=0.01, read_timeout=0.5))
    # The log lists requests as they complete: the stalled one is still sleeping on the hub.
    assert [g.range for g in file_gets(local_hub.hub, path=SHARD1)] == [f"bytes={CUT}-"]
    assert published(file_store, release)


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_errors_on_file_are_retried(local_hub, file_store, quarantine, release, status):
    local_hub.hub.faults.add(SHARD1, Fault.http_status(status, retry_after=0, times=2))
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.status for g in file_gets(local_hub.hub, path=SHARD1)] == [status, status, 200]
    assert published(file_store, release)


@pytest.mark.parametrize("status", [500, 503, 429])
def test_server_errors_on_revision_lookup_are_retried(local_hub, file_store, quarantine, release,
                                                      status):
    local_hub.hub.faults.add("/api/models/*", Fault.http_status(status, retry_after=0))
    result = run_stage(local_hub.endpoint, file_store, quarantine)
    assert result.commit == release
    assert [r.status for r in local_hub.hub.requests][:2] == [status, 200]


def test_retries_exhausted_keeps_partial_and_says_rerun(local_hub, file_store, quarantine, release):
    """The link drops after CUT bytes, then the hub answers 503 for good. Attempts that move
    bytes do not count towards giving up; the ones that move none do."""
    hub = local_hub.hub
    hub.faults.add(SHARD1, Fault.drop(after_bytes=CUT))

    class HubDiesAfterFirstBytes(StageObserver):
        armed = False

        def advance(self, path: str, nbytes: int) -> None:
            if path == SHARD1 and not self.armed:
                self.armed = True  # the first response is already being served: later ones fail
                hub.faults.add(SHARD1, Fault.http_status(503, times=None))

    retry = RetryPolicy(attempts=3, backoff=0.01)
    with pytest.raises(Unavailable) as err:
        stage(HubSource(local_hub.endpoint, token=False, retry=retry), file_store, REPO, "main",
              quarantine, StageOptions(retry=retry), HubDiesAfterFirstBytes())
    assert f"{SHARD1}: gave up after 3 attempts: HTTP 503" in str(err.value)
    assert "re-run the same command to resume" in err.value.hint
    assert [g.status for g in file_gets(hub, path=SHARD1)] == [200, 503, 503]
    assert_nothing_published(file_store)
    # Every byte received is kept for the re-run, which asks only for the rest.
    assert quarantine_of(quarantine, release).part_path(SHARD1).stat().st_size == CUT
    hub.faults.clear()
    mark = len(hub.requests)
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(hub, mark, SHARD1)] == [f"bytes={CUT}-"]
    assert published(file_store, release)


@pytest.mark.parametrize(
    "fault,rule",
    [
        # Attempt 1 serves the listed bytes and drops; the resumed tail is other bytes.
        (Fault.mutate(good_first=True), "sha256"),
        # Attempt 1 serves other bytes and drops; the resumed tail is the listed bytes.
        (Fault.mutate(good_first=False), "sha256"),
        (Fault.corrupt(offset=CUT + 7), "sha256"),
    ],
    ids=["changed-after-first-attempt", "changed-before-resume", "flipped-byte"],
)
def test_changed_bytes_are_refused_and_not_resumed(local_hub, file_store, quarantine, release,
                                                   fault, rule):
    local_hub.hub.faults.add(SHARD1, fault)
    local_hub.hub.faults.add(SHARD1, Fault.drop(after_bytes=CUT))
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    found = refusal(err.value, SHARD1)
    assert found.rule == rule and "upstream LFS sha256" in found.detail
    assert_nothing_published(file_store)
    # Wrong bytes are not resumed from: the next run starts the file from byte 0.
    assert not quarantine_of(quarantine, release).part_path(SHARD1).exists()
    local_hub.hub.faults.clear()
    mark = len(local_hub.hub.requests)
    run_stage(local_hub.endpoint, file_store, quarantine)
    assert [g.range for g in file_gets(local_hub.hub, mark, SHARD1)] == [None]
    assert published(file_store, release)


def test_small_file_with_wrong_bytes_is_refused_by_git_oid(local_hub, file_store, quarantine,
                                                          release):
    local_hub.hub.faults.add("config.json", Fault.corrupt(offset=3))
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    assert refusal(err.value, "config.json").rule == "git-oid"
    assert_nothing_published(file_store)


def test_listed_file_answering_404_is_refused(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add(SHARD1, Fault.http_status(404, times=None))
    with pytest.raises(ReleaseRefused) as err:
        run_stage(local_hub.endpoint, file_store, quarantine)
    found = refusal(err.value, SHARD1)
    assert found.rule == "download" and "404" in found.detail
    assert_nothing_published(file_store)


def test_hub_down_for_good_fails_with_unavailable(local_hub, file_store, quarantine, release):
    local_hub.hub.faults.add("/api/models/*", Fault.http_status(503, times=None))
    with pytest.raises(Unavailable, match="unavailable") as err:
        run_stage(local_hub.endpoint, file_store, quarantine,
                  retry=RetryPolicy(attempts=2, backoff=0.01))
    assert "re-run" in err.value.hint
    assert_nothing_published(file_store)
