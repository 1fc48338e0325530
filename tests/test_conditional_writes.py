"""S3 the store cannot be overwritten under, and a store that says what its place serves.

`k3a bootstrap`'s bucket policy refuses an object write without ``If-None-Match`` on the
create-once keys and without either condition on the compare-and-swap ones. SeaweedFS enforces
no bucket policy, so here a proxy in front of it judges every request by the rendered policy's
conditional-write statements and answers 403 where S3 would (tests/support/bucket_policy.py):
staging (streamed and whole-file uploads, references), materialization (in-bucket copies),
tuples, a policy, promotions and a repair all pass it, each create carrying the header, while
an insider's overwrite is refused. Where the bucket has no such policy, an overwritten object
is caught by ``check_served`` before HyperPod's ``s3Storage`` could serve it (the artifact gate,
``materialize``); on a file tree the same check hashes what is cheap to hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import xxhash

from k3artifacts.errors import K3AError, VerifyMismatch
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.revisions.manifest import FileRecord, SafetensorsSummary
from k3artifacts.stores.bucket_policies import BucketPolicyInputs, rendered
from k3artifacts.stores.s3 import MiB, S3Store, TransferTuning
from k3artifacts.stores.verify import verify_revision
from tests.fixtures.moves import check_gates, promote, use_policy
from tests.fixtures.people import person
from tests.fixtures.s3_fault_proxy import S3FaultProxy
from tests.staging_helpers import REPO, run_stage, small_release
from tests.support.bucket_policy import BucketPolicy
from tests.support.releases import Releases

ACCOUNT = "123456789012"
ROLES = {"admin_role_arn": f"arn:aws:iam::{ACCOUNT}:role/k3a-admin",
         "inference_role_arn": f"arn:aws:iam::{ACCOUNT}:role/k3a-inference",
         "kms_key_arn": f"arn:aws:kms:us-east-1:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"}
#: Operations that make an object: each must carry a condition.
CREATING = ("PutObject", "CopyObject", "CompleteMultipartUpload")
#: Keys that move by compare-and-swap; every other creating request must be If-None-Match.
SWAPPED = ("/releases/channels/", "/releases/policy/current.json",
           "/releases/policy/checkpoint.json", "/releases/policy/proposals/",
           "/releases/trust/proposals/", "/releases/trust/freshness.json", "/releases/probes/",
           "/releases/records/k3t-",
           "/.k3a/s3-objects.json", "/.k3a/provenance.json")
TUNING = TransferTuning(multipart_threshold=5 * MiB, min_part_size=5 * MiB, max_concurrency=4,
                        stream_part_size=5 * MiB)


def bucket_policy(bucket: str) -> BucketPolicy:
    inputs = BucketPolicyInputs(bucket=bucket, prefix="k3a", **ROLES)
    return BucketPolicy(rendered("s3/bucket-policy.json", inputs))


@pytest.fixture
def guarded(seaweed, seaweed_bucket, monkeypatch) -> Iterator[tuple[S3Store, S3FaultProxy]]:
    """A store on SeaweedFS behind a proxy enforcing the bootstrap policy of its bucket."""
    proxy = S3FaultProxy(seaweed.endpoint)
    proxy.policy = bucket_policy(seaweed_bucket)
    proxy.start()
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("K3A_S3_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    try:
        yield S3Store.from_url(f"s3://{seaweed_bucket}/k3a", endpoint_url=proxy.endpoint,
                               tuning=TUNING), proxy
    finally:
        proxy.stop()


@pytest.mark.s3
def test_every_write_the_store_makes_passes_the_bootstrap_policy(guarded, local_hub, tmp_path,
                                                                  policies):
    store, proxy = guarded
    files = small_release(tmp_path, shard_bytes=6 * MiB)  # streamed in 5 MiB parts
    first = local_hub.hub.add_commit(REPO, files)
    run_stage(local_hub.endpoint, store, tmp_path / "q")
    local_hub.hub.add_commit(REPO, {**files, "config.json": b'{"model_type": "kimi_k3"}'})
    second = run_stage(local_hub.endpoint, store, tmp_path / "q").commit  # reuses by reference
    assert store.materialize(REPO, second) > 6 * MiB  # copies: parts, and whole objects

    releases = Releases(store, tmp_path / "scratch")
    for commit in (first, second):
        release = releases.tuple_for(store.published_manifest(REPO, commit))
        use_policy(store, policies)  # its root: every signed record names it
        review_license(store, release.id, by=person("rita"))
        review_code(store, release.id, by=person("rita"))
        promote(store, release.id, "staging", actor="ci", policies_dir=policies)  # CAS twice

    (shard,) = [r for r in store.published_manifest(REPO, first).files
                if r.path == "model-00001-of-00002.safetensors"]
    store.repair_file(REPO, first, shard, Path(files[shard.path]))  # as the admin would
    assert verify_revision(store=store, repo_id=REPO, commit=first, full=True).ok

    assert [(r.operation, r.key, r.denied) for r in proxy.requests if r.denied] == []
    made = [r for r in proxy.requests if r.operation in CREATING]
    assert {r.operation for r in made} == set(CREATING)
    assert all(r.if_none_match == "*" or r.if_match for r in made)
    assert all(r.if_none_match == "*" for r in made if not any(k in r.key for k in SWAPPED))
    assert any(r.if_match for r in made if "/releases/channels/" in r.key)
    assert any(r.if_match for r in made if r.key.endswith("/.k3a/s3-objects.json"))


@pytest.mark.s3
def test_an_insider_cannot_overwrite_under_the_policy(guarded, tmp_path):
    store, proxy = guarded
    manifest = Releases(store, tmp_path / "scratch").publish()
    key = store.key(f"models/{manifest.repo_id}/{manifest.commit}/{manifest.files[0].path}")
    etag = store.client.head_object(Bucket=store.bucket, Key=key)["ETag"]
    refused = [
        lambda: store.client.put_object(Bucket=store.bucket, Key=key, Body=b"x"),
        lambda: store.client.put_object(Bucket=store.bucket, Key=key, Body=b"x", IfMatch=etag),
        lambda: store.client.copy_object(Bucket=store.bucket, Key=key, IfMatch=etag,
                                         CopySource={"Bucket": store.bucket, "Key": key}),
    ]
    for write in refused:
        with pytest.raises(Exception, match="AccessDenied"):
            write()
    assert [r.denied for r in proxy.requests if r.denied] == [
        "DenyUnconditionalWritesToTheStore", "DenyReplacingCreateOnceObjects",
        "DenyReplacingCreateOnceObjects"]


def _overwrite(store: S3Store, key: str) -> None:
    """Same size, other bytes, the k3a metadata copied over: what an insider would write."""
    head = store.client.head_object(Bucket=store.bucket, Key=store.key(key))
    store.client.put_object(Bucket=store.bucket, Key=store.key(key),
                            Body=b"x" * head["ContentLength"], Metadata=head["Metadata"],
                            ChecksumAlgorithm="CRC64NVME")


@pytest.mark.s3
@pytest.mark.parametrize("versioned", [True, False])
def test_an_overwritten_object_is_not_served(seaweed, versioned, tmp_path, policies,
                                             monkeypatch):
    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    bucket = seaweed.create_bucket(f"k3a-served-{str(versioned).lower()}-{os.getpid()}",
                                   versioned=versioned)
    store = S3Store.from_url(f"s3://{bucket}/k3a", endpoint_url=seaweed.endpoint, tuning=TUNING)
    releases = Releases(store, tmp_path / "scratch")
    manifest = releases.publish()
    release = releases.tuple_for(manifest)
    use_policy(store, policies)  # its root: every signed record names it
    review_license(store, release.id, by=person("rita"))
    review_code(store, release.id, by=person("rita"))
    assert store.check_served(manifest.repo_id, manifest.commit, manifest) == {}
    assert check_gates(store, release.id, "staging", policies_dir=policies).passed

    shard = manifest.files[1].path
    _overwrite(store, f"models/{manifest.repo_id}/{manifest.commit}/{shard}")
    served = store.check_served(manifest.repo_id, manifest.commit, manifest)
    assert list(served) == [shard] and "replaced after publication" in served[shard]
    report = check_gates(store, release.id, "staging", policies_dir=policies)
    reason = next(r for r in report.results if r.name == "artifact").reason
    assert not report.passed and f"{shard} as served: " in reason
    with pytest.raises(VerifyMismatch, match="does not serve"):
        store.materialize(manifest.repo_id, manifest.commit)


@pytest.mark.s3
def test_a_create_finding_other_bytes_at_its_key_is_refused_by_name(seaweed_store, tmp_path):
    store = seaweed_store
    commit = hashlib.sha1(b"taken").hexdigest()
    local = tmp_path / "config.json"
    local.write_bytes(b'{"n": 1}')
    record = FileRecord(path="config.json", size=8, kind="config",
                        sha256=hashlib.sha256(local.read_bytes()).hexdigest(),
                        xxh3_128=xxhash.xxh3_128_hexdigest(local.read_bytes()))
    key = store.key(f"models/{REPO}/{commit}/config.json")
    store.client.put_object(Bucket=store.bucket, Key=key, Body=b'{"n": 2}')
    with pytest.raises(K3AError, match="already holds an object that is not config.json") as err:
        store.begin_revision(REPO, commit).put_file(record, local)
    assert err.value.exit_code == 6 and "never replaced" in (err.value.hint or "")
    assert store.client.get_object(Bucket=store.bucket, Key=key)["Body"].read() == b'{"n": 2}'


# ---- the file store ------------------------------------------------------------------------


def _big_shard(seed: int) -> tuple[bytes, SafetensorsSummary]:
    """A safetensors file above SMALL_FILE (16 MiB): only its header is hashed by the check."""
    data = safetensors.numpy.save({"w": np.full((17 << 20) // 4, seed, dtype=np.float32)})
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + length]
    return data, SafetensorsSummary(
        header_len=length, tensor_count=1, dtypes=["F32"],
        header_sha256=hashlib.sha256(header).hexdigest(), data_bytes=len(data) - 8 - length)


def _edit(path: Path, offset: int, new: bytes) -> None:
    os.chmod(path.parent, 0o755)
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(new)


def test_the_file_store_hashes_small_files_and_headers_of_what_it_serves(file_store, tmp_path,
                                                                         policies):
    releases = Releases(file_store, tmp_path / "scratch")
    data, summary = _big_shard(7)
    manifest = releases.publish()
    workdir = tmp_path / "big"
    workdir.mkdir()
    (workdir / "big.safetensors").write_bytes(data)
    record = FileRecord(path="big.safetensors", size=len(data), kind="weights",
                        sha256=hashlib.sha256(data).hexdigest(),
                        xxh3_128=xxhash.xxh3_128_hexdigest(data), safetensors=summary)
    commit = hashlib.sha1(b"big").hexdigest()
    writer = file_store.begin_revision(manifest.repo_id, commit)
    big = manifest.model_copy(update={"commit": commit, "files": [*manifest.files, record],
                                      "total_bytes": manifest.total_bytes + len(data)})
    for file in manifest.files:
        writer.put_file(file, tmp_path / "scratch" / manifest.commit / file.path)
    writer.put_file(record, workdir / "big.safetensors")
    writer.commit(big)
    root = file_store.local_path(f"models/{manifest.repo_id}/{commit}")
    assert file_store.check_served(manifest.repo_id, commit, big) == {}
    release = releases.tuple_for(big)  # made while the store serves what was published

    config = json.dumps({"n": 9}).encode()  # same size as {"n": 1}: only a hash tells
    _edit(root / "config.json", 0, config)
    header_key = data[8:].index(b'"w"') + 8
    _edit(root / "big.safetensors", header_key + 1, b"v")  # a tensor renamed, same length
    served = file_store.check_served(manifest.repo_id, commit, big)
    assert set(served) == {"config.json", "big.safetensors"}
    assert "xxh3-128" in served["config.json"] and "header sha256" in served["big.safetensors"]
    use_policy(file_store, policies)  # its root: every signed record names it
    review_license(file_store, release.id, by=person("rita"))
    review_code(file_store, release.id, by=person("rita"))
    report = check_gates(file_store, release.id, "staging", policies_dir=policies)
    reason = next(r for r in report.results if r.name == "artifact").reason
    assert "config.json as served: xxh3-128" in reason
    with pytest.raises(VerifyMismatch, match="config.json"):
        file_store.materialize(manifest.repo_id, commit)


@pytest.mark.s3
def test_a_replaced_shard_fails_verify_and_the_hyperpod_render(seaweed, tmp_path, monkeypatch,
                                                               k3a_env):
    """The issue's case: after an S3 shard object was replaced, `k3a verify` (reading the
    recorded versions) said ok and the HyperPod render pointed at the replaced object. Both
    now check what the place serves: exit 4, naming the shard."""
    from tests.support.cli import invoke

    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    bucket = seaweed.create_bucket(f"k3a-replaced-{os.getpid()}", versioned=True)
    store = S3Store.from_url(f"s3://{bucket}/k3a", endpoint_url=seaweed.endpoint, tuning=TUNING)
    releases = Releases(store, tmp_path / "scratch")
    manifest = releases.publish()
    release = releases.tuple_for(manifest)
    revision = f"{manifest.repo_id}@{manifest.commit}"
    env = {**k3a_env, **seaweed.env, "K3A_STORE": store.url,
           "AWS_ENDPOINT_URL_S3": seaweed.endpoint}
    env.pop("AWS_SESSION_TOKEN", None)
    invoke("verify", revision, env=env)
    invoke("render", release.id, "--target", "hyperpod", env=env)

    shard = manifest.files[1].path
    _overwrite(store, f"models/{manifest.repo_id}/{manifest.commit}/{shard}")
    verified = invoke("verify", revision, env=env, expect=4)
    assert (f"{shard}: as served where the revision is placed: the current object is version"
            in verified.stderr + verified.stdout)
    assert "replaced after publication" in verified.stderr + verified.stdout
    rendered = invoke("render", release.id, "--target", "hyperpod", env=env, expect=4)
    assert f"does not serve {revision} as published: {shard}: the current object is version" \
        in rendered.stderr
