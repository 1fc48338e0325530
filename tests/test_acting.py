"""Who acts is the identity whose key signs (k3artifacts/policy/acting.py), on a file store
and on SeaweedFS (an S3 store with no identity service at all): first use seeds the root and
names the seeder; a key the policy names for nobody, a role it lacks and a typed name are
refused by name; an STS endpoint answering another identity changes nothing."""

from __future__ import annotations

import json

import boto3
import pytest
import yaml

from k3artifacts.policy.record import in_force
from k3artifacts.releases.channels import history
from k3artifacts.trust.identities import (
    ROLES,
    SEEDED_ROLES,
    Identities,
    Identity,
    KeyEntry,
    identities_yaml,
)
from k3artifacts.trust.keys import personal_key_path, read_public_key
from k3artifacts.trust.pins import load_pin
from k3artifacts.trust.root import root_key
from tests.fixtures.moves import use_policy
from tests.fixtures.people import ME, key_file, signer_of
from tests.support.cli import invoke
from tests.support.releases import Releases
from tests.support.sts_standin import sts_standin


@pytest.fixture
def judged(any_store, any_env):
    """A store (a file tree, or SeaweedFS, which has no STS: nothing is asked of one) and the
    environment of a `k3a` on it."""
    return any_store, any_env


def test_first_use_makes_the_key_the_root_and_names_the_seeder(judged, tmp_path):
    store, env = judged
    Releases(store, tmp_path / "scratch").release()  # the store exists, no policy
    seeded = invoke("policy", "init", env=env)
    key = personal_key_path()
    assert f"made your personal key: {key}" in seeded.stderr
    signer = KeyEntry.of(read_public_key(key.with_name("personal.pub.pem")))
    pin = load_pin(store.url)
    assert pin is not None and pin.how == "first-use"
    assert (pin.root.version, pin.root.threshold) == (1, 1)
    assert [k.id for k in pin.root.identities[ME]] == [signer.id]
    assert store.read(root_key(1)) is not None  # published for others to pin by fingerprint
    named = in_force(store).document.identities.identities
    assert list(named) == [ME] and named[ME].roles == list(SEEDED_ROLES)  # all but release
    assert [k.id for k in named[ME].keys] == [signer.id]
    shown = invoke("key", "show", "--json", env=env).json
    assert shown["key_id"] == signer.id
    # Made once: the next command that signs says nothing about it.
    assert "made your personal key" not in invoke("policy", "init", expect=6, env=env).stderr


def test_a_store_whose_root_this_client_does_not_pin_is_not_seeded_by_it(judged, k3a_env,
                                                                         tmp_path):
    store, env = judged
    Releases(store, tmp_path / "scratch").release()
    invoke("trust", "init", env=env)  # the first client makes its key the store's root, no policy yet
    other = dict(env, XDG_CONFIG_HOME=str(tmp_path / "other-client"))
    refused = invoke("policy", "init", expect=9, env=other)
    assert "has a root of trust, which this client does not pin" in refused.stderr
    assert "k3a trust init --fingerprint" in refused.stderr
    assert in_force(store).version == 0


def test_a_key_the_policy_names_for_nobody_is_refused_with_the_next_step(judged, policies,
                                                                          tmp_path):
    store, env = judged
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    stranger = dict(env, K3A_IDENTITY_KEY=str(key_file("not-in-the-policy", tmp_path)))
    for args in (["promote", release.id, "staging"], ["review", "license", release.id],
                 ["policy", "propose", str(policies)]):
        refused = invoke(*args, "--json", expect=9, env=stranger)
        document = json.loads(refused.stdout)
        assert document["exit_code"] == 9, args
        assert "is no identity of the store's policy" in document["error"], args
        assert "k3a key show" in document["next"] and "k3a policy propose" in document["next"]
    assert store.list_keys("releases/reviews/") == []
    with pytest.raises(Exception, match="never been promoted"):
        history(store, "staging")


def test_an_identity_without_the_role_is_refused(judged, policies, tmp_path):
    store, env = judged
    reviewer = Identity(roles=["review"], keys=[KeyEntry.for_signer(signer_of("rita"))])
    admin = Identity(roles=list(ROLES), keys=[KeyEntry.for_signer(signer_of("policy-admin"))])
    (policies / "identities.yaml").write_text(identities_yaml(Identities(
        identities={"rita": reviewer, "policy-admin": admin})))
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    as_rita = dict(env, K3A_IDENTITY_KEY=str(key_file("rita", tmp_path)))
    refused = invoke("promote", release.id, "staging", expect=9, env=as_rita)
    assert "moving staging is signed with the role promote; rita holds review" in refused.stderr
    assert "identities.yaml" in refused.stderr


def test_a_typed_name_is_refused(judged, policies, tmp_path):
    store, env = judged
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    for args in (["review", "license", release.id], ["promote", release.id, "staging"]):
        refused = invoke(*args, "--by", "alice", expect=9, env=env)
        assert "--by 'alice': who acts is the identity whose key signs" in refused.stderr
        assert "k3a key show" in refused.stderr and "K3A_IDENTITY_KEY" in refused.stderr


def test_an_sts_answering_another_identity_changes_nothing(judged, policies, tmp_path):
    """A stand-in STS (a real HTTP server answering GetCallerIdentity with mallory's ARN) named
    by both variables that could point at one: k3a never asks it, and the reviewer and the
    mover recorded are the key's identity, as without it."""
    store, env = judged
    use_policy(store, policies)
    release = Releases(store, tmp_path / "scratch").release()
    mallory = "arn:aws:iam::999999999999:user/mallory"
    with sts_standin(tmp_path, mallory) as sts:
        # It is a working STS: boto3 pointed at it hears mallory.
        asked = boto3.client("sts", endpoint_url=sts.url, region_name="us-east-1",
                             aws_access_key_id="x", aws_secret_access_key="y")
        assert asked.get_caller_identity()["Arn"] == mallory
        before = len(sts.asked())
        pointed = dict(env, AWS_ENDPOINT_URL_STS=sts.url, K3A_STS_ENDPOINT_URL=sts.url)
        review = invoke("review", "license", release.id, "--json", env=pointed).json
        invoke("review", "code", release.id, env=pointed)
        moved = invoke("promote", release.id, "staging", "--json", env=pointed).json
        assert len(sts.asked()) == before
    assert (review["review"]["reviewed_by"], review["review"]["reviewer_source"]) == (ME, "key")
    assert (moved["entry"]["who"], moved["entry"]["who_source"]) == (ME, "key")
    assert "mallory" not in yaml.safe_dump(history(store, "staging")[-1].model_dump(mode="json"))


@pytest.mark.s3
def test_a_kms_key_where_no_kms_answers_is_named_as_such(seaweed_store, seaweed, k3a_env):
    """An S3-compatible server (SeaweedFS) named as the KMS endpoint: the identity service a
    kms: key needs is missing, said as such, neither as a permission nor as throttling."""
    env = dict(k3a_env, **seaweed.env, K3A_STORE=seaweed_store.url,
               K3A_IDENTITY_KEY="kms:alias/k3a", K3A_KMS_ENDPOINT_URL=seaweed.endpoint)
    env.pop("AWS_SESSION_TOKEN", None)
    refused = invoke("key", "show", expect=9, env=env)
    assert "no AWS KMS answers there" in refused.stderr and "has no KMS" in refused.stderr
    assert "throttling" not in refused.stderr and "permission" not in refused.stderr

