"""S3 faults: a proxy on loopback in front of the moto server fails, loses or holds chosen
requests (by S3 operation, key and part number) while the real boto3/s3transfer upload runs."""

from __future__ import annotations

import pytest

from k3artifacts.errors import Unavailable
from k3artifacts.stores.s3 import MiB, S3Store, TransferTuning
from k3artifacts.stores.verify import verify_revision
from tests.faults.faultkit import (
    SHARD1,
    SHARD2,
    file_gets,
    stage_args,
    start_k3a,
    verified_paths,
)
from tests.staging_helpers import REPO, run_stage, small_release
from tests.support.cli import run_process
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.s3]


@pytest.fixture
def release(local_hub, tmp_path):
    # Shards of 6 MiB: two parts each with the 5 MiB multipart threshold below.
    return local_hub.hub.add_commit(REPO, small_release(tmp_path, shard_bytes=6 * MiB))


def proxied_store(s3_url: str, proxy, **kw) -> S3Store:
    return S3Store.from_url(
        s3_url, endpoint_url=proxy.endpoint,
        tuning=TransferTuning(multipart_threshold=5 * MiB, min_part_size=5 * MiB,
                              max_concurrency=2), **kw)


def key_of(commit: str, path: str) -> str:
    return f"models/{REPO}/{commit}/{path}"


def assert_unpublished(store: S3Store, commit: str) -> None:
    assert store.read_manifest(REPO, commit) is None
    assert commit not in store.list_revisions(REPO)


def published_ok(store: S3Store, commit: str) -> bool:
    return verify_revision(store=store, repo_id=REPO, commit=commit, full=True).ok


def test_part_errors_are_retried_and_upload_completes(local_hub, s3_fault_proxy, s3_url,
                                                     tmp_path, release):
    proxy = s3_fault_proxy
    proxy.add("UploadPart", f"*/{SHARD1}", part=2, status=503, code="SlowDown", times=2)
    proxy.add("UploadPart", f"*/{SHARD2}", part=1, status=500, code="InternalError")
    store = proxied_store(s3_url, proxy)
    run_stage(local_hub.endpoint, store, tmp_path / "quarantine")

    tries = [r.status for r in proxy.ops("UploadPart") if r.key.endswith(SHARD1) and r.part == 2]
    assert tries == [503, 503, 200]
    tries = [r.status for r in proxy.ops("UploadPart") if r.key.endswith(SHARD2) and r.part == 1]
    assert tries == [500, 200]
    assert published_ok(store, release)


def test_part_failing_for_good_publishes_nothing_and_rerun_completes(
        local_hub, s3_fault_proxy, s3_url, tmp_path, release, monkeypatch):
    proxy, quarantine = s3_fault_proxy, tmp_path / "quarantine"
    proxy.add("UploadPart", f"*/{SHARD1}", part=2, status=503, code="SlowDown", times=None)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    store = proxied_store(s3_url, proxy)
    with pytest.raises(Unavailable) as err:
        run_stage(local_hub.endpoint, store, quarantine)
    assert SHARD1 in str(err.value) and "SlowDown" in str(err.value)
    assert_unpublished(store, release)
    verified = verified_paths(quarantine, release)
    assert SHARD1 in verified

    proxy.release()
    hub_mark, s3_mark = len(local_hub.hub.requests), len(proxy.requests)
    run_stage(local_hub.endpoint, store, quarantine)
    assert published_ok(store, release)
    # Nothing verified before the failure is downloaded again, and objects already in S3 are kept.
    assert not verified & {g.target for g in file_gets(local_hub.hub, hub_mark)}
    stored_before = {r.key for r in proxy.requests[:s3_mark]
                     if r.operation in ("PutObject", "CompleteMultipartUpload") and r.status == 200}
    uploaded_again = {r.key for r in proxy.requests[s3_mark:]
                      if r.operation in ("PutObject", "CreateMultipartUpload")}
    assert not stored_before & uploaded_again - {k for k in uploaded_again if "/.k3a/" in k}


def test_lost_complete_multipart_response(local_hub, s3_fault_proxy, s3_url, tmp_path, release):
    proxy = s3_fault_proxy
    proxy.add("CompleteMultipartUpload", f"*/{SHARD1}", action="lose")
    store = proxied_store(s3_url, proxy)
    run_stage(local_hub.endpoint, store, tmp_path / "quarantine")
    completes = [r.status for r in proxy.ops("CompleteMultipartUpload") if r.key.endswith(SHARD1)]
    # S3 applied the first Complete; its answer was lost and the retry found the object made.
    assert completes == [500, 200]
    assert published_ok(store, release)


def test_lost_manifest_put_response_is_idempotent(local_hub, s3_fault_proxy, s3_url, tmp_path,
                                                  release):
    proxy = s3_fault_proxy
    proxy.add("PutObject", "*/.k3a/manifest.json", action="lose")
    store = proxied_store(s3_url, proxy)
    run_stage(local_hub.endpoint, store, tmp_path / "quarantine")
    # S3 stored it; the answer was lost; the retry of the conditional put gets 412.
    assert [r.status for r in proxy.ops("PutObject") if r.key.endswith("manifest.json")] == [500, 412]
    assert published_ok(store, release)


def multipart_uploads(s3_client, bucket: str) -> list[str]:
    return [u["Key"] for u in s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def test_kill_mid_put_object_then_rerun(local_hub, s3_fault_proxy, s3_url, s3_env, tmp_path,
                                        k3a_cmd):
    """``k3a stage`` to S3 killed while a shard's PutObject is in flight."""
    proxy, quarantine = s3_fault_proxy, tmp_path / "quarantine"
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    env = {**s3_env, "K3A_S3_ENDPOINT_URL": proxy.endpoint}
    args = stage_args(local_hub.endpoint, S3Store.from_url(s3_url, endpoint_url=proxy.endpoint),
                      quarantine)
    proxy.add("PutObject", f"*/{SHARD1}", action="stall")
    run = start_k3a(k3a_cmd, env, *args)
    wait_until(proxy.stalled.is_set, "the shard upload to reach the proxy", proc=run.proc)
    run.kill9()

    store = S3Store.from_url(s3_url, endpoint_url=proxy.endpoint)
    assert_unpublished(store, commit)
    verified = verified_paths(quarantine, commit)
    assert SHARD1 in verified

    proxy.release()
    hub_mark = len(local_hub.hub.requests)
    done = run_process(*args, env=env, cmd=k3a_cmd, expect=None)
    assert done.returncode == 0, done.stderr
    assert published_ok(store, commit)
    assert not verified & {g.target for g in file_gets(local_hub.hub, hub_mark)}


def test_kill_between_parts_then_rerun_aborts_stale_upload(
        local_hub, s3_fault_proxy, s3_url, s3_env, s3_client, s3_bucket, tmp_path, k3a_cmd,
        release):
    """A process killed between the parts of a multipart upload leaves an open upload in the
    bucket (invisible, but billed); the re-run aborts it and publishes."""
    proxy, quarantine = s3_fault_proxy, tmp_path / "quarantine"
    env = {**s3_env, "K3A_S3_ENDPOINT_URL": proxy.endpoint}
    proxy.add("UploadPart", f"*/{SHARD1}", part=2, action="stall")
    run = start_k3a([k3a_cmd[0], "-m", "tests.faults.stage_runner"], env,
                    s3_url, local_hub.endpoint, str(quarantine))
    wait_until(proxy.stalled.is_set, "part 2 of the shard to reach the proxy", proc=run.proc)
    run.kill9()

    store = S3Store.from_url(s3_url, endpoint_url=proxy.endpoint)
    assert_unpublished(store, release)
    assert any(k.endswith(SHARD1) for k in multipart_uploads(s3_client, s3_bucket))

    proxy.release()
    done = run_process(*stage_args(local_hub.endpoint, store, quarantine),
                       env=env, cmd=k3a_cmd, expect=None)
    assert done.returncode == 0, done.stderr
    assert published_ok(store, release)
    assert multipart_uploads(s3_client, s3_bucket) == []
