"""Production takes only what can be served, was staged, and was approved by someone else."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from k3artifacts.errors import ConfigError, GateFailed, UntrustedRecord
from k3artifacts.releases.channels import current, history
from k3artifacts.releases.reviewing import review_license
from k3artifacts.releases.reviews import review_key
from tests.fixtures.moves import check_gates, promote, use_policy
from tests.fixtures.people import key_file, person
from tests.fixtures.releases import passing_run, staged_for
from tests.support.cli import invoke
from tests.support.releases import Releases


def _ready(store, release, policies, reviewed):
    reviewed(release)
    passing_run(store, release)


def _failed(store, release, policies, actor="pat"):
    report = check_gates(store, release.id, "production", policies_dir=policies, actor=actor)
    return {r.name: r.reason for r in report.failed}


def test_a_tuple_that_does_not_render_is_refused_until_recreated_with_the_input(
    file_store, tmp_path, policies
):
    releases = Releases(file_store, tmp_path / "scratch")
    manifest = releases.publish()
    bare = releases.tuple_for(manifest, site=False)  # made without --fsx-*
    for r in (bare,):
        use_policy(file_store, policies)  # its root: every signed record names it
        review_license(file_store, r.id, by=person("rita"))
        passing_run(file_store, r)
        staged_for(file_store, r, policies)
    failed = _failed(file_store, bare, policies)
    assert set(failed) == {"renderable"}
    assert "hyperpod:" in failed["renderable"] and "--fsx-id" in failed["renderable"]
    with pytest.raises(GateFailed, match="renderable"):
        promote(file_store, bare.id, "production", actor="pat", policies_dir=policies)
    with pytest.raises(ConfigError, match="cannot be overridden"):
        promote(file_store, bare.id, "production", actor="pat", policies_dir=policies,
                overrides={"renderable": "trust me"})
    two_nodes = releases.tuple_for(manifest, profile="b200x8-2node-tp8-pp2")
    assert "spans 2 nodes" in _failed(file_store, two_nodes, policies)["renderable"]

    # The same weights, re-created with the FSx location: a new tuple, which renders.
    fixed = releases.tuple_for(manifest)
    passing_run(file_store, fixed)
    staged_for(file_store, fixed, policies)
    moved = promote(file_store, fixed.id, "production", actor="pat", policies_dir=policies)
    gates = {g.name: g for g in moved.gates}
    assert gates["renderable"].passed and "hyperpod" in gates["renderable"].reason
    assert current(file_store, "production").tuple_id == fixed.id


def test_eks_target_needs_a_verifier_image(file_store, tmp_path, policies):
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace("targets: [hyperpod]", "targets: [eks]"))
    releases = Releases(file_store, tmp_path / "scratch")
    bare = releases.tuple_for(releases.publish(), verifier_image=None)
    assert "--verifier-image" in _failed(file_store, bare, policies)["renderable"]


def test_production_refuses_a_tuple_never_on_staging_or_not_long_enough(
    store, releases, policies, reviewed
):
    release = releases.release()
    _ready(store, release, policies, reviewed)
    failed = _failed(store, release, policies)
    assert set(failed) == {"promotion_order"}
    assert f"never promoted to staging; `k3a promote {release.id} staging` first" in (
        failed["promotion_order"])
    now = datetime.now(UTC)
    promote(store, release.id, "staging", actor="ci", policies_dir=policies,
            now=now - timedelta(hours=2))
    early = _failed(store, release, policies)["promotion_order"]
    assert "on staging for 2.0 h" in early and "the policy needs 24.0 h" in early
    with pytest.raises(GateFailed, match="promotion_order"):
        promote(store, release.id, "production", actor="pat", policies_dir=policies)
    # A day later (the clock of the move is the gate's clock): it goes.
    later = now + timedelta(hours=23)
    moved = promote(store, release.id, "production", actor="pat", policies_dir=policies,
                    now=later)
    assert moved.changed and history(store, "production")[0].who == "pat"


def test_time_on_staging_ends_when_staging_moves_on(store, releases, policies, reviewed):
    first, second = releases.release(), releases.release()
    for r in (first, second):
        _ready(store, r, policies, reviewed)
    now = datetime.now(UTC)
    promote(store, first.id, "staging", actor="ci", policies_dir=policies,
            now=now - timedelta(hours=30))
    promote(store, second.id, "staging", actor="ci", policies_dir=policies,
            now=now - timedelta(hours=29))
    assert "on staging for 1.0 h" in _failed(store, first, policies)["promotion_order"]


def test_the_reviewer_cannot_promote_to_production(store, releases, policies, reviewed):
    release = releases.release(code={"modeling_kimi.py": b"x = 1\n"})
    _ready(store, release, policies, reviewed)  # reviewed by rita
    staged_for(store, release, policies)
    with pytest.raises(GateFailed, match="rita reviewed the license and code") as own:
        promote(store, release.id, "production", actor="rita", policies_dir=policies)
    assert "no override" in own.value.hint
    with pytest.raises(ConfigError, match="cannot be overridden"):
        promote(store, release.id, "production", actor="rita", policies_dir=policies,
                overrides={"separation_of_duties": "short-staffed"})
    assert promote(store, release.id, "production", actor="pat", policies_dir=policies).changed


def test_hand_written_reviews_do_not_satisfy_the_gate(store, releases, policies):
    release = releases.release()
    sha = release.binding.license_sha256
    # An uncommitted or hand-edited file under policies/ is not a review any more.
    (policies / "licenses").mkdir()
    (policies / "licenses" / "moonshotai--Kimi-K3.yaml").write_text(
        f"reviews:\n  - sha256: {sha}\n    reviewed_by: alice\n    reviewed_on: 2025-01-01\n")
    failed = _failed(store, release, policies)
    assert f"license sha256 {sha} has not been reviewed (no record {review_key('license', sha)}" in (
        failed["license"])
    # A signed review copied under the key of the tuple's text is refused: its statement
    # names the key it was signed for.
    other = review_license(store, releases.release(license_text="Apache-2.0\n").id,
                           by=person("rita"))
    body = store.read(other.key).data
    store.create(review_key("license", sha), body)
    with pytest.raises(UntrustedRecord, match=r"refused \(wrong-key\): signed for") as moved:
        check_gates(store, release.id, "staging", policies_dir=policies)
    assert moved.value.exit_code == 4


def _assumed(moto_endpoint, name):
    """Credentials of a distinct principal, as moto's STS hands them out."""
    sts = boto3.client("sts", endpoint_url=moto_endpoint, region_name="us-east-1")
    creds = sts.assume_role(RoleArn="arn:aws:iam::123456789012:role/release", RoleSessionName=name)
    c = creds["Credentials"]
    return {"AWS_ACCESS_KEY_ID": c["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": c["SecretAccessKey"],
            "AWS_SESSION_TOKEN": c["SessionToken"]}


@pytest.mark.s3
def test_on_s3_the_actor_is_the_key_whatever_the_credentials_or_a_flag_say(
    s3_store, s3_env, moto_endpoint, policies, tmp_path
):
    """Each person's S3 credentials are a distinct STS principal here, and none of that names
    who acts: the key does. A typed --by is refused, K3A_ACTOR is not read."""
    use_policy(s3_store, policies)
    releases = Releases(s3_store, tmp_path / "scratch")
    release = releases.release()
    env = dict(s3_env, K3A_STORE=s3_store.url, K3A_ACTOR="mallory")

    def k3a(*args, credentials, key, expect=0):
        return invoke(*args, expect=expect, env={
            **env, **_assumed(moto_endpoint, credentials),
            "K3A_IDENTITY_KEY": str(key_file(key, tmp_path))})

    typed = k3a("review", "license", release.id, "--by", "alice", credentials="rita", key="rita",
                expect=9)
    assert "never a typed name" in typed.stderr and "k3a key show" in typed.stderr
    # pat's credentials, rita's key: rita reviewed.
    recorded = json.loads(k3a("review", "license", release.id, "--json", credentials="pat",
                              key="rita").stdout)
    assert (recorded["review"]["reviewed_by"], recorded["review"]["reviewer_source"]) == (
        "rita", "key")
    passing_run(s3_store, release)
    staged_for(s3_store, release, policies)

    own = k3a("promote", release.id, "production", credentials="pat", key="rita", expect=5)
    assert "rita reviewed the license" in own.stderr
    k3a("promote", release.id, "production", "--by", "pat", credentials="pat", key="rita",
        expect=9)
    moved = json.loads(k3a("promote", release.id, "production", "--json", credentials="rita",
                           key="pat").stdout)
    entry = moved["entry"]
    assert (entry["who"], entry["who_source"]) == ("pat", "key")
    assert "mallory" not in json.dumps(history(s3_store, "production")[-1].model_dump(mode="json"))


def test_order_can_require_gates_passed_on_the_earlier_channel(store, releases, policies):
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace("after: staging", "after: staging\n      passed: [license]"))
    release = releases.release()
    use_policy(store, policies)  # its root: every signed record names it
    passing_run(store, release)
    promote(store, release.id, "staging", actor="ci", policies_dir=policies,
            overrides={"license": "legal is reading it"},
            now=datetime.now(UTC) - timedelta(hours=48))
    review_license(store, release.id, by=person("rita"))
    reason = _failed(store, release, policies)["promotion_order"]
    assert "on staging (#1) license did not pass (overridden or not run)" in reason
