"""Records bound to their store (k3artifacts/trust/envelope.py, the store id of
k3artifacts/trust/root.py), on a file store and on SeaweedFS: two stores seeded by the same
identities have roots of their own, and a record signed in one (a review, an evaluation, a
channel's history), copied into the other by an insider with write access to it (``open()``
on the tree, ``PutObject`` on S3, no k3a code), is refused there by name, exit 4, where a user
reads it; the same record signed in the other store passes."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import pytest
import yaml

from k3artifacts.policy.actor import Acting
from k3artifacts.policy.record import seed
from k3artifacts.releases.channels import history_key, pointer_key
from k3artifacts.releases.reviews import review_key
from k3artifacts.releases.tuples import tuple_key
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.pins import trusted_roots
from k3artifacts.trust.root import Root
from tests.fixtures import people
from tests.fixtures.moves import POLICY_ADMIN, use_policy, with_people
from tests.support.releases import Releases
from tests.test_trust_evidence import (  # noqa: F401 - full_policies: a fixture
    FAMILIES,
    full_policies,
    k3a,
    production_evidence,
    write_identities,
)
from tests.test_trust_root import accounts

CHANNEL = "staging"


@pytest.fixture(params=["file", pytest.param("seaweed", marks=pytest.mark.s3)])
def two_stores(request, tmp_path, k3a_env):
    """Two stores of one kind, each as (store, the environment of a `k3a` on it, how an insider
    writes a key of it); one client (one configuration) uses both."""
    if request.param == "file":
        stores = [FileStore(tmp_path / name) for name in ("store-a", "store-b")]

        def writer(store):
            def insider(key: str, data: bytes) -> None:
                path = store.root / key
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "wb") as out:
                    out.write(data)
            return insider

        return [(s, dict(k3a_env, K3A_STORE=s.url), writer(s)) for s in stores]
    from k3artifacts.stores.s3 import S3Store

    seaweed = request.getfixturevalue("seaweed")
    first = request.getfixturevalue("seaweed_store")
    second = S3Store.from_url(f"s3://{first.bucket}/k3a-other", endpoint_url=seaweed.endpoint)
    s3 = seaweed.client()

    def writer(store):
        def put_object(key: str, data: bytes) -> None:
            s3.put_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}", Body=data)
        return put_object

    env = dict(k3a_env, **seaweed.env)
    env.pop("AWS_SESSION_TOKEN", None)
    return [(s, dict(env, K3A_STORE=s.url), writer(s)) for s in (first, second)]


def _seeded_alike(two_stores, policies):
    """Both stores seeded with one policy by the same identities: their roots name the same
    keys and threshold, and each has its own store id."""
    for store, _, _ in two_stores:
        use_policy(store, policies)
    (a, _, _), (b, _, _) = two_stores
    root_a, root_b = trusted_roots(a).current, trusted_roots(b).current
    assert root_a.identities == root_b.identities and root_a.threshold == root_b.threshold
    assert root_a.store_id and root_b.store_id and root_a.store_id != root_b.store_id
    return root_a.store_id, root_b.store_id


def _refused(error: str, key: str, mine: str, theirs: str) -> None:
    assert error.startswith(f"{key}: refused (another-store): "), error
    assert f"signed for store {theirs}; this store's id is {mine}" in error, error


def test_a_review_and_a_channel_history_copied_from_another_store_are_refused(
        two_stores, policies, tmp_path):
    (a, env_a, _), (b, env_b, into_b) = two_stores
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump({"channels": {
        CHANNEL: {"gates": ["artifact", "license"]}}}))
    write_identities(policies)
    id_a, id_b = _seeded_alike(two_stores, policies)
    # The same revision staged into both: its license review at the same key.
    ours = Releases(a, tmp_path / "scratch-a").release()
    theirs = Releases(b, tmp_path / "scratch-b").release()
    assert ours.binding.license_sha256 == theirs.binding.license_sha256
    key = review_key("license", ours.binding.license_sha256)

    # The honest path in store A: rita reviews, alice's gates pass, alice promotes.
    k3a(env_a, "rita", tmp_path, "review", "license", ours.id)
    assert k3a(env_a, "alice", tmp_path, "promote", ours.id, CHANNEL)["changed"]

    # A's review, copied into B: refused by name wherever B's gates read it.
    into_b(key, a.read(key).data)
    for command in (["gates", theirs.id, CHANNEL], ["promote", theirs.id, CHANNEL]):
        _refused(k3a(env_b, "alice", tmp_path, *command, expect=4)["error"], key, id_b, id_a)
    # A's channel history (pointer and entry), copied into B: refused by every reader there.
    for copied in (history_key(CHANNEL, 1), pointer_key(CHANNEL)):
        into_b(copied, a.read(copied).data)
    for command in (["history", CHANNEL], ["render", CHANNEL, "--target", "eks"]):
        error = k3a(env_b, "alice", tmp_path, *command, expect=4)["error"]
        _refused(error, pointer_key(CHANNEL), id_b, id_a)

    # The honest path in store B: what the insider wrote gone, rita's review signed here.
    for copied in (key, history_key(CHANNEL, 1), pointer_key(CHANNEL)):
        b.delete(copied)
    k3a(env_b, "rita", tmp_path, "review", "license", theirs.id)
    assert k3a(env_b, "alice", tmp_path, "promote", theirs.id, CHANNEL)["changed"]
    assert len(k3a(env_b, "alice", tmp_path, "history", CHANNEL)) == 1


def test_evidence_copied_from_another_store_is_refused(
        two_stores, full_policies, tmp_path):  # noqa: F811
    """Evaluations, scans, preflights and traffic analyses signed in store A by the very
    identities store B trusts for them count for nothing in B."""
    (a, _, _), (b, env_b, into_b) = two_stores
    id_a, id_b = _seeded_alike(two_stores, full_policies)
    ours = Releases(a, tmp_path / "scratch-a").release()
    Releases(b, tmp_path / "scratch-b").release()  # the same revision, staged into B too
    keys = production_evidence(a, ours, full_policies)
    # A's tuple and its evidence, copied into B at their own keys.
    into_b(tuple_key(ours.id), a.read(tuple_key(ours.id)).data)
    for family in FAMILIES:
        for key in keys[family]:
            into_b(key, a.read(key).data)
    error = k3a(env_b, "pat", tmp_path, "gates", ours.id, "production", expect=4)["error"]
    copied = {key for family in FAMILIES for key in keys[family]}
    assert any(error.startswith(f"{key}: refused (another-store): ") for key in copied), error
    _refused(error, error.split(":", 1)[0], id_b, id_a)
    # The same evidence signed in B passes B's evidence gates.
    for key in copied:
        b.delete(key)
    production_evidence(b, ours, full_policies)
    report = k3a(env_b, "pat", tmp_path, "gates", ours.id, "production", expect=5)
    passed = {g["name"] for g in report["results"] if g["passed"]}
    assert {"evaluation", "image_scan", "infrastructure", "traffic"} <= passed, report


def _seeded_before_ids(store, policies) -> None:
    """``policies`` seeded into ``store`` as stores were before they had ids: root v1 names
    none (and so is the same root for every store its seeder seeded)."""
    acting = people.seeder(POLICY_ADMIN)
    assert acting.seeding is not None
    plain = {k: v for k, v in acting.seeding.root.model_dump().items() if k != "store_id"}
    old = replace(acting.seeding, root=Root.model_validate(plain))
    seed(store, with_people(policies), acting=Acting(acting.actor, acting.signer, acting.roles,
                                                     seeding=old))


def test_a_store_older_than_ids_gets_one_by_rotation_and_reads_what_it_held(
        two_stores, policies, tmp_path):
    """Two stores seeded before ids by the same identity share one root. B's next rotation
    gives it an id: what B held keeps verifying and moves go on, while A's review, copied in
    afterwards, is refused (it names no store, and B never held it)."""
    (a, env_a, _), (b, env_b, into_b) = two_stores
    (policies / "promotion-gates.yaml").write_text(yaml.safe_dump({"channels": {
        CHANNEL: {"gates": ["artifact", "license"]}}}))
    write_identities(policies)
    for store, _, _ in two_stores:
        _seeded_before_ids(store, policies)
    assert trusted_roots(a).current == trusted_roots(b).current  # one root, no id
    assert trusted_roots(b).current.store_id is None
    ours = Releases(a, tmp_path / "scratch-a").release()
    releases_b = Releases(b, tmp_path / "scratch-b")
    theirs = releases_b.release()
    key = review_key("license", ours.binding.license_sha256)
    for store_env, release in ((env_a, ours), (env_b, theirs)):
        k3a(store_env, "rita", tmp_path, "review", "license", release.id)
    assert k3a(env_b, "alice", tmp_path, "promote", theirs.id, CHANNEL)["changed"]

    done = k3a(env_b, POLICY_ADMIN, tmp_path, "trust", "rotate")  # nothing but the id
    store_id = done["root"]["store_id"]
    assert done["published"] and store_id is not None
    # What B held before its id still verifies, and the next move is signed with it.
    second = releases_b.release()
    assert k3a(env_b, "alice", tmp_path, "gates", second.id, CHANNEL)["passed"]
    assert k3a(env_b, "alice", tmp_path, "promote", second.id, CHANNEL)["changed"]
    assert len(k3a(env_b, "alice", tmp_path, "history", CHANNEL)) == 2
    signed = json.loads(b.read(history_key(CHANNEL, 2)).data)["envelope"]["payload"]
    assert json.loads(base64.b64decode(signed))["predicate"]["store"] == store_id
    # A's review (validly signed by the same identity, for no store) counts for nothing now.
    into_b(key, a.read(key).data)
    error = k3a(env_b, "alice", tmp_path, "gates", second.id, CHANNEL, expect=4)["error"]
    assert error.startswith(f"{key}: refused (another-store): signed for no store, and not "
                            f"among the records store {store_id} held"), error


def test_a_team_pins_one_store_id_and_a_pin_drawing_another_is_refused_by_name(
        k3a_cmd, k3a_env, tmp_path):
    """A team's keys pinned by each member: the first pin draws the store id and publishes the
    root; a member pinning the same keys with another id is told which, and pins the same
    root with --store-id."""
    k3a = accounts(tmp_path / "store", k3a_cmd, k3a_env, tmp_path)
    alice = k3a("alice", "key", "create")["public_path"]
    bob = k3a("bob", "key", "create")["public_path"]
    team = ("--root", f"alice={alice}", "--root", f"bob={bob}")
    first = k3a("alice", "trust", "init", *team)
    store_id = first["root"]["store_id"]
    assert first["how"] == "init" and len(store_id) == 32
    refused = k3a("bob", "trust", "init", *team, code=4)["error"]
    assert refused.startswith("releases/trust/root/0000000001.json: refused (root-mismatch): "
                              f"the store's root v1 names these keys with store id {store_id}")
    joined = k3a("bob", "trust", "init", *team, "--store-id", store_id)
    assert joined["root"]["fingerprint"] == first["root"]["fingerprint"]
    assert k3a("carol", "trust", "init", "--store-id", store_id, code=2)["exit_code"] == 2
