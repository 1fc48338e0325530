"""The store's policy as a signed chain (k3artifacts/policy/record.py), on a file store and on
SeaweedFS: every version signed into force by root identities (the root's threshold, or one
for a provably stricter change), verified by every reader from this client's pinned root; a
pointer set to a document never signed into force, a change edited, removed or forked are
refused by name; and a loosening change of each policy field needs a second root identity."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import UntrustedRecord
from k3artifacts.policy.approvals import InvalidApproval
from k3artifacts.policy.change import answer, apply, propose
from k3artifacts.policy.document import PolicyDocument
from k3artifacts.policy.proposal import proposal_key
from k3artifacts.policy.record import (
    KIND,
    POINTER_KEY,
    PolicyChange,
    change_key,
    changes,
    document_key,
    in_force,
    seed,
)
from k3artifacts.policy.signed import store_id
from k3artifacts.trust import rotation
from k3artifacts.trust.chain import Link
from k3artifacts.trust.envelope import sign_record
from k3artifacts.trust.identities import Identity, KeyEntry, ReleaseChannel, identities_yaml
from k3artifacts.trust.pins import require_pin
from tests.fixtures import people
from tests.fixtures.any_store import overwrite, remove
from tests.fixtures.moves import with_people
from tests.support.cli import invoke
from tests.support.releases import Releases

ALICE, BOB = "alice", "bob"


@pytest.fixture
def as_alice(any_env, tmp_path):
    """`k3a` on the store, signing as alice."""
    return dict(any_env, K3A_IDENTITY_KEY=str(people.key_file(ALICE, tmp_path)))


def two_roots(any_store, policies) -> PolicyDocument:
    """The store seeded by alice (root v1: alice), then root v2: alice and bob, threshold 2."""
    seed(any_store, with_people(policies), acting=people.seeder(ALICE))
    rotation.rotate(any_store, require_pin(any_store.url), people.signer_of(ALICE),
                    add={BOB: [KeyEntry.for_signer(people.signer_of(BOB))]}, remove=[],
                    threshold=None)
    assert require_pin(any_store.url).root.threshold == 2
    return in_force(any_store).document


def edited(document: PolicyDocument, rel: str, edit: Callable[[str], str]) -> PolicyDocument:
    text = edit(document.files[rel])
    assert text != document.files[rel], rel
    return document.with_file(rel, text)


def gates(old: str, new: str) -> Callable[[PolicyDocument], PolicyDocument]:
    return lambda d: edited(d, "promotion-gates.yaml", lambda t: t.replace(old, new, 1))


def identities(change: Callable[[dict], None]) -> Callable[[PolicyDocument], PolicyDocument]:
    def edit(document: PolicyDocument) -> PolicyDocument:
        named = dict(document.identities.identities)
        change(named)
        return document.with_file("identities.yaml", identities_yaml(
            document.identities.model_copy(update={"identities": named})))
    return edit


def release_rule(**rule: object) -> Callable[[PolicyDocument], PolicyDocument]:
    """The document with production's release rule ``rule``."""
    def edit(document: PolicyDocument) -> PolicyDocument:
        return document.with_file("identities.yaml", identities_yaml(
            document.identities.model_copy(update={"release_channels": {
                "production": ReleaseChannel.model_validate(rule)}})))
    return edit


#: One key for every call: a change is built twice (proposed, then compared with what applied).
RELEASE_KEY = KeyEntry.of(ec.generate_private_key(ec.SECP256R1()).public_key())


def _release_key(named: dict) -> None:
    named["release"] = Identity(roles=["release"], keys=[RELEASE_KEY])


def _role_back(named: dict) -> None:
    named["rita"] = Identity(roles=[*named["rita"].roles, "warm"], keys=named["rita"].keys)


def _role_less(named: dict) -> None:
    named["rita"] = Identity(roles=[r for r in named["rita"].roles if r != "warm"],
                             keys=named["rita"].keys)


#: (field, a stricter change first (None: none), then the change that loosens that field)
LOOSENING = [
    ("traffic bounds", None, gates("max_error_rate: 0.01", "max_error_rate: 0.05")),
    ("traffic steps", None, gates("{weight: 5, pause: 30m}", "{weight: 5, pause: 10m}")),
    ("traffic window", None, gates("window: 10m", "window: 5m")),
    ("preflight max age", None, gates("max_age_hours: 24", "max_age_hours: 72")),
    ("warm-start signing",
     gates("    rollback_approval: false\n",
           "    rollback_approval: false\n    warm_start: {require_signature: true}\n"),
     gates("warm_start: {require_signature: true}", "warm_start: {require_signature: false}")),
    ("retention", None, gates("keep_days: 14", "keep_days: 1")),
    ("rollback approval", gates("rollback_approval: false", "rollback_approval: true"),
     gates("rollback_approval: true", "rollback_approval: false")),
    ("gates", None, gates("separation_of_duties, ", "")),
    ("a new channel", None, lambda d: edited(d, "promotion-gates.yaml", lambda t: t.replace(
        "channels:\n", "channels:\n  canary:\n    gates: [artifact]\n", 1))),
    ("evaluation settings", None, gates("min_pass_rate: 0.95", "min_pass_rate: 0.5")),
    ("promotion order", None, gates("min_hours: 24", "min_hours: 1")),
    ("regression comparison", None, gates("max_regression: 0.05", "max_regression: null")),
    ("latency margin", gates("margin: 0.10", "margin: 0.05"), gates("margin: 0.05",
                                                                     "margin: 0.20")),
    ("latency floor", gates("floor_ms: 1.0", "floor_ms: 0.5"), gates("floor_ms: 0.5",
                                                                     "floor_ms: 5")),
    ("latency alpha", gates("alpha: 0.01", "alpha: 0.05"), gates("alpha: 0.05",
                                                                  "alpha: 0.001")),
    ("latency inconclusive", None, gates("inconclusive: fail", "inconclusive: pass")),
    ("latency samples", None, gates("min_samples: 40", "min_samples: 20")),
    ("canary against stable", gates("min_requests: 20}", "min_requests: 20}\n      "
                                    "against_stable: {margin: 0.05}"),
     gates("against_stable: {margin: 0.05}", "against_stable: null")),
    ("serving targets", gates("targets: [hyperpod]", "targets: [hyperpod, eks]"),
     gates("targets: [hyperpod, eks]", "targets: [hyperpod]")),
    ("typed names", None, gates("claimed_actor_on_file_stores: false",
                                "claimed_actor_on_file_stores: true")),
    ("suites", None, lambda d: edited(d, "eval-suites/k3-core.yaml", lambda t: t + "\n# x\n")),
    ("identities", None, identities(lambda n: n.__setitem__("carol-2", Identity(
        roles=["review"], keys=[KeyEntry.for_signer(people.signer_of("carol-2"))])))),
    ("keys", None, identities(lambda n: n.__setitem__("rita", Identity(
        roles=n["rita"].roles, keys=[*n["rita"].keys, KeyEntry.for_signer(
            people.signer_of("rita-laptop"))])))),
    ("roles", identities(_role_less), identities(_role_back)),
    ("release rule", release_rule(required=True), release_rule(required=False)),
    ("release bytes", release_rule(required=True), release_rule(required=True,
                                                                verify_bytes=False)),
    ("release identity", release_rule(required=True), identities(_release_key)),
]


@pytest.mark.parametrize("stricter,loosen", [(s, lo) for _, s, lo in LOOSENING],
                         ids=[name for name, _, _ in LOOSENING])
def test_a_loosening_change_of_each_field_needs_a_second_root_identity(
        any_store, policies, stricter, loosen):
    document = two_roots(any_store, policies)
    alice, bob = people.person(ALICE), people.person(BOB)
    if stricter is not None:  # provably stricter: alice alone puts it in force
        document = stricter(document)
        request, _ = propose(any_store, document, by=alice)
        assert request.needs == []
        apply(any_store, request.id, by=alice)
    request, _ = propose(any_store, loosen(document), by=alice)
    assert request.needs
    with pytest.raises(InvalidApproval, match="needs 2 root identities of root v2"):
        apply(any_store, request.id, by=alice)
    _, signed = answer(any_store, request.id, by=bob, approve=True, reason="reviewed")
    assert signed == {ALICE, BOB}
    policy = apply(any_store, request.id, by=alice)
    assert policy.digest == loosen(document).digest
    assert changes(any_store)[-1].signers == {ALICE, BOB}


def _propose_loosening(any_store, policies):
    document = two_roots(any_store, policies)
    loose = gates("min_pass_rate: 0.95", "min_pass_rate: 0.5")(document)
    request, _ = propose(any_store, loose, by=people.person(ALICE))
    return request, loose


READERS = (["policy", "show"], ["policy", "history"])


def _refused_everywhere(as_alice, any_store, tmp_path, reason: str) -> None:
    scratch = tmp_path / "scratch"
    release = Releases(any_store, scratch / str(len(list(scratch.glob("*"))))).release()
    for args in (*READERS, ["gates", release.id, "staging"],
                 ["promote", release.id, "staging"], ["render", "staging", "--target", "eks"]):
        refused = invoke(*args, expect=4, env=as_alice)
        assert f"refused ({reason})" in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr


def test_a_pointer_to_a_proposal_never_signed_into_force_is_refused(any_store, as_alice, policies,
                                                                    tmp_path):
    """The proposal alice signed alone (it loosens: root v2 needs alice and bob), copied into
    the pointer, is a validly signed change that lacks its authority."""
    request, _ = _propose_loosening(any_store, policies)
    before = in_force(any_store)
    proposal = any_store.read(proposal_key(request.id))
    any_store.replace(POINTER_KEY, proposal.data, any_store.read(POINTER_KEY).token)
    _refused_everywhere(as_alice, any_store, tmp_path, "threshold")
    with pytest.raises(UntrustedRecord, match="needs 2 root identities of root v2; signed by"):
        in_force(any_store)
    assert before.version == 1


def test_a_pointer_written_by_hand_is_refused(any_store, as_alice, policies, tmp_path):
    """A pointer naming a proposed document the way stores older than signing did, or one
    signed by a key that is no root identity's."""
    request, loose = _propose_loosening(any_store, policies)
    current = in_force(any_store)
    token = any_store.read(POINTER_KEY).token
    change = PolicyChange(version=3, digest=loose.digest, previous_digest=current.digest,
                          action="change", by=people.person(ALICE).actor,
                          at=request.requested_at, root_version=2)
    plain = {"schema_version": 1, "version": 3, "digest": loose.digest,
             "change": change.model_dump(mode="json")}
    token = any_store.replace(POINTER_KEY, canonical_json(plain), token)
    _refused_everywhere(as_alice, any_store, tmp_path, "unsigned")
    forged = sign_record(key=change_key(3), kind=KIND, signer=people.signer_of("mallory"),
                         identity="alice", body=Link(seq=3, previous=current.chain.head.digest,
                                                     entry=change.model_dump(mode="json")),
                         store_id=store_id(any_store))
    any_store.replace(POINTER_KEY, forged, token)
    _refused_everywhere(as_alice, any_store, tmp_path, "untrusted-key")


def _three_versions(any_store, policies):
    two_roots(any_store, policies)
    alice = people.person(ALICE)
    document = gates("min_hours: 24", "min_hours: 36")(in_force(any_store).document)
    request, _ = propose(any_store, document, by=alice)
    apply(any_store, request.id, by=alice)
    document = gates("min_hours: 36", "min_hours: 48")(document)
    request, _ = propose(any_store, document, by=alice)
    apply(any_store, request.id, by=alice)
    assert in_force(any_store).version == 3


def test_an_edited_change_is_refused(any_store, as_alice, policies, tmp_path):
    _three_versions(any_store, policies)
    record = json.loads(any_store.read(change_key(1)).data)
    record["body"]["entry"]["why"] = "nobody wrote this"
    overwrite(any_store, change_key(1), canonical_json(record))
    _refused_everywhere(as_alice, any_store, tmp_path, "edit")


def test_a_removed_change_is_refused(any_store, as_alice, policies, tmp_path):
    _three_versions(any_store, policies)
    remove(any_store, change_key(2))
    _refused_everywhere(as_alice, any_store, tmp_path, "gap")


def test_a_removed_document_is_refused_by_name(any_store, as_alice, policies, tmp_path):
    """The document the head of the history names, deleted: every reader refuses it as a
    stored record (exit 4), naming the key, rather than as an unknown name."""
    _three_versions(any_store, policies)
    key = document_key(in_force(any_store).digest)
    remove(any_store, key)
    release = Releases(any_store, tmp_path / "scratch").release()
    for args in (*READERS, ["gates", release.id, "staging"], ["promote", release.id, "staging"]):
        refused = invoke(*args, expect=4, env=as_alice)
        assert f"{key} is missing from" in refused.stderr, (args, refused.stderr)


def test_a_forked_change_is_refused(any_store, as_alice, policies, tmp_path):
    """Version 2 replaced by another, validly signed by alice (a root identity): it is not
    the one version 3 follows."""
    _three_versions(any_store, policies)
    entry = json.loads(any_store.read(change_key(2)).data)["body"]
    entry["entry"]["why"] = "another version 2"
    overwrite(any_store, change_key(2), sign_record(key=change_key(2), kind=KIND, body=entry,
                                               signer=people.signer_of(ALICE),
                                               identity=ALICE, store_id=store_id(any_store)))
    _refused_everywhere(as_alice, any_store, tmp_path, "fork")


def test_a_stricter_change_needs_one_root_identity_and_readers_follow_the_root(
        any_store, as_alice, policies, tmp_path):
    """alice alone tightens under root v2 (threshold 2); a reader that pinned root v1 follows
    the rotation and verifies both versions, each under the root it names."""
    two_roots(any_store, policies)
    proposed = invoke("policy", "propose", str(_stricter_dir(any_store, tmp_path)), "--json", env=as_alice)
    request = json.loads(proposed.stdout)
    assert request["needs"] == []
    assert invoke("policy", "apply", request["id"], "--json", env=as_alice).json[
        "version"] == 2
    listed = invoke("policy", "history", "--json", env=as_alice).json
    assert [(c["version"], c["root_version"], c["signed_by"]) for c in listed] == [
        (1, 1, [ALICE]), (2, 2, [ALICE])]


def _stricter_dir(any_store, tmp_path):
    out = tmp_path / "stricter"
    in_force(any_store).document.write_dir(out)
    path = out / "promotion-gates.yaml"
    path.write_text(path.read_text().replace("min_pass_rate: 0.95", "min_pass_rate: 0.99"))
    assert yaml.safe_load(path.read_text())
    return out


def test_a_rewound_policy_is_refused_by_every_reader_that_saw_the_newer_version(
        any_store, as_alice, policies, tmp_path):
    """Version 3 deleted and version 2's validly signed change copied over the pointer: the
    history is whole as far as it goes, and this client, which verified version 3, refuses
    it naming both heads."""
    _three_versions(any_store, policies)
    seen = in_force(any_store).chain.head.digest
    remove(any_store, change_key(3))
    overwrite(any_store, POINTER_KEY, any_store.read(change_key(2)).data)
    _refused_everywhere(as_alice, any_store, tmp_path, "rewound")
    refused = invoke("policy", "show", expect=4, env=as_alice).stderr
    assert f"the store's policy: this client verified #3 ({seen[:12]}) before; the store " \
        "now shows #2 (" in refused
