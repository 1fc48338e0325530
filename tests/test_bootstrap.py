"""``k3a bootstrap`` against moto: applies, shows diffs, and is a no-op the second time."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from k3artifacts.errors import ConfigError
from k3artifacts.stores import awsclients
from k3artifacts.stores.bootstrap import bootstrap, log_target_statement
from k3artifacts.stores.bucket_policies import BucketPolicyInputs

pytestmark = pytest.mark.s3

ACCOUNT = "123456789012"  # moto's default account
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/k3a-admin"
INFERENCE = f"arn:aws:iam::{ACCOUNT}:role/k3a-inference"
KMS = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ROLE_ARGS = ["--admin-role-arn", ADMIN, "--inference-role-arn", INFERENCE, "--kms-key-arn", KMS]


def inputs_for(bucket: str, **kw) -> BucketPolicyInputs:
    return BucketPolicyInputs(bucket=bucket, prefix="k3a", admin_role_arn=ADMIN,
                              inference_role_arn=INFERENCE, kms_key_arn=KMS, **kw)


def test_bootstrap_shows_drift_applies_and_then_changes_nothing(
    s3_client, s3_bucket: str, moto_endpoint: str
) -> None:
    # Drift an operator might have left: a half public access block, a lifecycle rule of theirs.
    s3_client.put_public_access_block(Bucket=s3_bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": False,
        "RestrictPublicBuckets": True})
    theirs = {"ID": "expire-scratch", "Status": "Enabled", "Filter": {"Prefix": "scratch/"},
              "Expiration": {"Days": 7}}
    s3_client.put_bucket_lifecycle_configuration(
        Bucket=s3_bucket, LifecycleConfiguration={"Rules": [theirs]})
    client = awsclients.s3_client(moto_endpoint)
    inputs = inputs_for(s3_bucket)

    plan = bootstrap(client, inputs, dry_run=True)
    changed = {c.setting: c for c in plan.changes}
    assert "versioning" not in changed  # the fixture enabled it already
    assert set(changed) == {"encryption", "public_access_block", "ownership_controls",
                            "lifecycle_rule", "policy"}
    pab_diff = changed["public_access_block"].diff()
    assert '-  "BlockPublicPolicy": false,' in pab_diff
    assert '+  "BlockPublicPolicy": true,' in pab_diff
    assert "(not set)" in changed["policy"].diff()
    assert s3_client.get_public_access_block(Bucket=s3_bucket)[
        "PublicAccessBlockConfiguration"]["BlockPublicPolicy"] is False  # dry run: untouched

    applied = bootstrap(client, inputs)
    assert [c.setting for c in applied.changes] == [c.setting for c in plan.changes]
    assert bootstrap(client, inputs).changes == []

    enc = s3_client.get_bucket_encryption(Bucket=s3_bucket)["ServerSideEncryptionConfiguration"]
    assert enc["Rules"][0]["ApplyServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms", "KMSMasterKeyID": KMS}
    rules = s3_client.get_bucket_lifecycle_configuration(Bucket=s3_bucket)["Rules"]
    assert {r["ID"] for r in rules} == {"expire-scratch", "k3a-retention"}
    policy = json.loads(s3_client.get_bucket_policy(Bucket=s3_bucket)["Policy"])
    assert policy["Id"] == "k3artifacts-release-bucket"


def test_bootstrap_enables_versioning_never_suspends(s3_client, moto_endpoint: str) -> None:
    bucket = f"k3a-test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3_client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    report = bootstrap(awsclients.s3_client(moto_endpoint), inputs_for(bucket))
    versioning = next(c for c in report.changes if c.setting == "versioning")
    assert (versioning.live, versioning.wanted) == ({"Status": "Suspended"}, {"Status": "Enabled"})
    assert s3_client.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"


def test_logging_needs_the_log_bucket_to_allow_delivery(s3_client, s3_bucket: str,
                                                        moto_endpoint: str) -> None:
    logs = f"k3a-logs-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=logs)
    client = awsclients.s3_client(moto_endpoint)
    inputs = inputs_for(s3_bucket, log_bucket=logs)
    with pytest.raises(ConfigError) as refused:
        bootstrap(client, inputs)
    assert "logging.s3.amazonaws.com" in (refused.value.hint or "")

    s3_client.put_bucket_policy(Bucket=logs, Policy=json.dumps(
        {"Version": "2012-10-17", "Statement": [log_target_statement(inputs)]}))
    bootstrap(client, inputs)
    assert s3_client.get_bucket_logging(Bucket=s3_bucket)["LoggingEnabled"] == {
        "TargetBucket": logs, "TargetPrefix": f"{s3_bucket}/k3a/"}
    assert bootstrap(client, inputs).changes == []


def run(cmd: list[str], env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cmd, *args], env=env, check=False, capture_output=True, text=True, timeout=120)


def test_cli_creates_applies_and_reports_no_changes(k3a_cmd, s3_env, s3_client, tmp_path) -> None:
    bucket = f"k3a-test-{uuid.uuid4().hex[:12]}"
    url = f"s3://{bucket}/k3a"

    missing = run(k3a_cmd, s3_env, "bootstrap", url, *ROLE_ARGS)
    assert missing.returncode == 7, missing.stderr
    assert "--create-bucket" in missing.stderr

    first = run(k3a_cmd, s3_env, "bootstrap", url, *ROLE_ARGS, "--create-bucket", "--json",
                "--iam-out", str(tmp_path / "iam"))
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["created_bucket"] and report["applied"]
    assert "versioning" in report["changed"] and "policy" in report["changed"]
    assert sorted(p.name for p in (tmp_path / "iam").iterdir()) == [
        "downloader.json", "inference.json", "promoter.json"]
    assert s3_client.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"

    second = run(k3a_cmd, s3_env, "bootstrap", url, *ROLE_ARGS)
    assert second.returncode == 0, second.stderr
    assert f"s3://{bucket}: no changes" in second.stdout


def test_cli_dry_run_prints_a_diff(k3a_cmd, s3_env, s3_bucket) -> None:
    out = run(k3a_cmd, s3_env, "bootstrap", f"s3://{s3_bucket}", *ROLE_ARGS, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "--- live/public_access_block" in out.stdout
    assert "+++ wanted/public_access_block" in out.stdout
    assert "dry run: 5 setting(s) differ; nothing changed" in out.stdout


def test_cli_bad_arn_is_a_config_error(k3a_cmd, s3_env, s3_bucket) -> None:
    args = [a if a != KMS else "alias/k3a" for a in ROLE_ARGS]
    out = run(k3a_cmd, s3_env, "bootstrap", f"s3://{s3_bucket}", *args)
    assert out.returncode == 9
    assert "not a KMS key ARN" in out.stderr and "next:" in out.stderr
