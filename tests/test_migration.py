"""Stores older than signing (k3artifacts/migration), on a file store and on SeaweedFS: read as
found where their policy says so, never moved on, until `k3a trust migrate` re-signs their
histories as found under a root identity's signature; then verified like any other, signed
throughout, old entries included."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.errors import UntrustedRecord
from k3artifacts.migration.registry import MIGRATORS
from k3artifacts.migration.release_keys import migrated
from k3artifacts.policy.actor import Actor
from k3artifacts.policy.document import SIGNING_FILE, PolicyDocument
from k3artifacts.policy.record import (
    POINTER_KEY,
    LegacyPointer,
    PolicyChange,
    change_key,
    changes,
    in_force,
    seed,
    store_document,
)
from k3artifacts.policy.signed import store_id
from k3artifacts.releases.channels import ChannelPointer, HistoryEntry, history, history_key
from k3artifacts.releases.channels import pointer_key as channel_key
from k3artifacts.trust.chain import Link
from k3artifacts.trust.envelope import is_unsigned, sign_record
from k3artifacts.trust.identities import Identities, Identity, KeyEntry, identities_yaml
from k3artifacts.trust.pins import load_pin
from k3artifacts.trust.root import root_key
from tests.fixtures import people
from tests.fixtures.any_store import overwrite
from tests.fixtures.people import ME, me_signer
from tests.support.cli import K3A, invoke
from tests.support.releases import Releases

OLD = Actor(name="alice", source="os-user")
BASE = "releases/channels/staging/base.json"
T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _entry(channel, seq, tuple_id, before, digest, when):
    return HistoryEntry(channel=channel, seq=seq, action="promote", tuple_id=tuple_id,
                        previous_tuple_id=before, who="alice", who_source="os-user",
                        when=when, why=f"move #{seq}", policy_digest=digest, policy_version=1)


def old_store(any_store, policies, tmp_path, *, read_before_migration=True):
    """What k3a wrote before records were signed: policy v1 and v2 (v2's mover died before
    logging its change), staging moved twice, production once (its mover died before
    logging the entry). Returns staging's two tuples and production's."""
    gates = policies / "promotion-gates.yaml"
    if not read_before_migration:
        gates.write_text(gates.read_text() + "unsigned: {read_before_migration: false}\n")
    first = PolicyDocument.from_dir(policies)
    second = first.with_file("promotion-gates.yaml", gates.read_text().replace(
        "min_hours: 24", "min_hours: 12"))
    for document in (first, second):
        store_document(any_store, document)
    v1 = PolicyChange(version=1, digest=first.digest, action="seed", by=OLD, at=T0)
    v2 = PolicyChange(version=2, digest=second.digest, previous_digest=first.digest,
                      action="change", by=OLD, at=T0 + timedelta(hours=1), approved_by=OLD)
    any_store.create(change_key(1), canonical_json(v1))
    any_store.replace(POINTER_KEY, canonical_json(LegacyPointer(version=2, digest=second.digest,
                                                            change=v2)), None)
    releases = Releases(any_store, tmp_path / "scratch")
    a, b, c = releases.release(), releases.release(), releases.release()
    staged = [_entry("staging", 1, a.id, None, first.digest, T0),
              _entry("staging", 2, b.id, a.id, first.digest, T0 + timedelta(hours=2))]
    for entry in staged:
        any_store.create(history_key("staging", entry.seq), canonical_json(entry))
    any_store.replace(channel_key("staging"), canonical_json(ChannelPointer.for_entry(staged[-1])),
                  None)
    live = _entry("production", 1, c.id, None, first.digest, T0 + timedelta(hours=3))
    any_store.replace(channel_key("production"), canonical_json(ChannelPointer.for_entry(live)),
                  None)
    return releases, (a, b, c)


def test_an_old_store_is_read_as_found_and_never_moved_on(any_store, any_env, policies, tmp_path):
    _, (a, b, c) = old_store(any_store, policies, tmp_path)
    assert "policy version 2" in invoke("policy", "show", env=any_env).stdout
    assert len(invoke("history", "staging", "--json", env=any_env).json) == 2
    assert [e.tuple_id for e in history(any_store, "production")] == [c.id]
    invoke("render", "staging", "--target", "eks", env=any_env)
    for args in (["rollback", "staging"], ["promote", a.id, "staging"],
                 ["policy", "propose", str(policies)]):
        refused = invoke(*args, expect=9, env=any_env)
        assert "predates signed records" in refused.stderr, args
        assert "k3a trust migrate" in refused.stderr
    assert any_store.read(root_key(1)) is None and load_pin(any_store.url) is None


def test_an_old_store_whose_policy_says_so_is_not_read(any_store, any_env, policies, tmp_path):
    old_store(any_store, policies, tmp_path, read_before_migration=False)
    refused = invoke("policy", "show", expect=4, env=any_env)
    assert "refused (unsigned)" in refused.stderr and "k3a trust migrate" in refused.stderr


def test_migrate_re_signs_the_histories_and_signs_the_next_version(any_store, any_env, policies,
                                                                   tmp_path):
    releases, (a, b, c) = old_store(any_store, policies, tmp_path)
    dry = invoke("trust", "migrate", "--dry-run", "--json", env=any_env).json
    assert dry["first_use"] and set(dry["families"]) == {m.family for m in MIGRATORS}
    assert dry["families"]["policy"][0] == "re-sign policy versions 1 to 2 (unsigned) as found"
    assert sorted(dry["families"]["channels"]) == [
        "re-sign channel production's entries 1 to 1 (unsigned) as found",
        "re-sign channel staging's entries 1 to 2 (unsigned) as found"]
    assert any_store.read(root_key(1)) is None  # a dry run writes nothing

    migrated = invoke("trust", "migrate", env=any_env)
    assert "did make your key" in migrated.stdout
    policy = in_force(any_store)
    assert (policy.version, policy.chain.head.entry.action) == (3, "migrate")
    assert list(policy.document.identities.identities) == [ME]
    assert [(r.change.version, sorted(r.signers)) for r in changes(any_store)] == [
        (1, []), (2, []), (3, [ME])]
    assert [e.tuple_id for e in history(any_store, "staging")] == [a.id, b.id]
    assert [e.tuple_id for e in history(any_store, "production")] == [c.id]

    # The pointers hold the signed bases; the log's unsigned copies stay as written, unread.
    for key in (channel_key("production"), channel_key("staging"), POINTER_KEY):
        assert not is_unsigned(any_store.read(key).data, key=key), key
    assert is_unsigned(any_store.read(history_key("staging", 1)).data, key="")

    # Moves go on from the re-signed entries; one older than signing is a rollback target.
    back = invoke("rollback", "staging", "--json", env=any_env).json
    assert (back["tuple_id"], back["entry"]["seq"], back["entry"]["who"]) == (a.id, 3, ME)
    assert [e.seq for e in history(any_store, "staging")] == [1, 2, 3]
    assert "nothing to migrate" in invoke("trust", "migrate", env=any_env).stdout

    # The log's unsigned copy edited changes nothing; the base edited is refused.
    plain = json.loads(any_store.read(history_key("staging", 1)).data)
    overwrite(any_store, history_key("staging", 1),
              canonical_json({**plain, "tuple_id": c.id}))
    assert [e.tuple_id for e in history(any_store, "staging")] == [a.id, b.id, a.id]
    record = json.loads(any_store.read(BASE).data)
    record["body"]["links"][-1]["entry"]["why"] = "rewritten"
    overwrite(any_store, BASE, canonical_json(record))
    refused = invoke("history", "staging", expect=4, env=any_env)
    assert f"{BASE}: refused (tampered)" in refused.stderr


def test_an_entry_older_than_signing_only_in_the_base(any_store, any_env, policies, tmp_path):
    """A root identity signs the entries older than signing into the base; it cannot pass a
    move of its own off as one older than signing (it holds no `promote` for it)."""
    _, (a, b, _) = old_store(any_store, policies, tmp_path)
    invoke("trust", "migrate", env=any_env)
    invoke("rollback", "staging", env=any_env)  # #3, signed by its mover
    head = json.loads(any_store.read(channel_key("staging")).data)["body"]
    forged = {**head["entry"], "seq": 4, "tuple_id": b.id, "previous_tuple_id": a.id,
              "who_source": "os-user", "policy_version": None, "policy_digest": None,
              "migrated_under": 1}
    link = Link(seq=4, previous=canonical_digest(head), entry=forged)
    key = history_key("staging", 4)
    any_store.replace(channel_key("staging"),
                      sign_record(key=key, kind="channel-entry", body=link, signer=me_signer(),
                                  identity=ME, store_id=store_id(any_store)),
                      any_store.read(channel_key("staging")).token)
    refused = invoke("history", "staging", expect=4, env=any_env)
    assert "refused (edit)" in refused.stderr
    assert "older than signing where it is not in the history's base" in refused.stderr


def test_a_migration_that_died_part_way_is_refused_until_it_runs_again(any_store, any_env,
                                                                       policies, tmp_path):
    """Killed with staging's entries re-signed and its pointer not yet: readers refuse the
    unsigned head naming `k3a trust migrate`, which then finishes the job."""
    _, (a, b, _) = old_store(any_store, policies, tmp_path)
    env = dict(any_env, K3A_FAULT_PAUSE="migrate-resigned@channel staging:120")
    proc = subprocess.Popen([*K3A, "trust", "migrate"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        # Blocks until the process prints the pause (or exits: then the lines say why).
        for line in iter(proc.stderr.readline, ""):
            seen.append(line)
            if line.startswith("k3a: paused at"):
                break
        assert "k3a: paused at migrate-resigned channel staging" in seen[-1], seen
    finally:
        proc.kill()
        proc.wait()
    refused = invoke("history", "staging", expect=4, env=any_env)
    assert f"{channel_key('staging')}: refused (unsigned)" in refused.stderr
    assert "k3a trust migrate" in refused.stderr

    dry = invoke("trust", "migrate", "--dry-run", "--json", env=any_env).json
    assert dry["families"]["channels"] == [
        "re-sign channel staging's entries 1 to 2 (unsigned) as found"]
    assert dry["families"]["policy"] == []
    invoke("trust", "migrate", env=any_env)
    assert [e.tuple_id for e in history(any_store, "staging")] == [a.id, b.id]


def test_a_history_that_does_not_hold_together_is_not_vouched_for(any_store, any_env, policies,
                                                                  tmp_path):
    _, (a, _, _) = old_store(any_store, policies, tmp_path)
    # staging's pointer set back to #1 by hand: its log goes on to #2.
    entry = HistoryEntry.model_validate_json(any_store.read(history_key("staging", 1)).data)
    any_store.replace(channel_key("staging"), canonical_json(ChannelPointer.for_entry(entry)),
                  any_store.read(channel_key("staging")).token)
    refused = invoke("trust", "migrate", expect=4, env=any_env)
    assert "set back by hand" in refused.stderr
    assert any_store.read(root_key(1)) is None  # refused before anything was written


def test_migrate_re_signs_evidence_written_before_signing(any_store, any_env, policies,
                                                          tmp_path):
    """A license review written before records were signed (plain JSON) is re-signed by `k3a
    trust migrate`, which vouches for it as the migrating root identity; from then on it is
    read as any signed review is, and edited after the fact it is refused."""
    from k3artifacts.policy.signed import read_signed
    from k3artifacts.releases.reviews import REVIEWS, Review, review_key

    _, (a, _, _) = old_store(any_store, policies, tmp_path)
    sha = a.binding.license_sha256
    w = a.binding.weights
    key = review_key("license", sha)
    any_store.create(key, canonical_json(Review(
        kind="license", sha256=sha, path="LICENSE", reviewed_by="rita", reviewer_source="os-user",
        reviewed_at=T0, tuple_id=a.id, repo_id=w.repo_id, commit=w.commit)))
    dry = invoke("trust", "migrate", "--dry-run", "--json", env=any_env).json
    assert dry["families"]["evidence"] == ["re-sign 1 unsigned review record(s)"]

    invoke("trust", "migrate", env=any_env)
    review = read_signed(any_store, key, REVIEWS)
    assert (review.sha256, review.tuple_id) == (sha, a.id)
    assert "nothing to migrate" in invoke("trust", "migrate", env=any_env).stdout

    record = json.loads(any_store.read(key).data)
    record["body"] = {**record["body"], "note": "edited"}
    overwrite(any_store, key, canonical_json(record))
    with pytest.raises(UntrustedRecord, match="tampered"):
        read_signed(any_store, key, REVIEWS)


def test_migrate_makes_release_keys_of_trusted_keys_yaml_identities(any_store, any_env,
                                                                    policies, tmp_path):
    """A policy in force that still trusts a release key by signing/trusted-keys.yaml: its
    release signatures are checked against nothing (refused, naming `k3a trust migrate`)
    until the migration makes the key an identity holding the release role and the channel
    rule a release_channels rule; a signature the key made before then verifies as it did."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = tmp_path / "release.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    private.chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    document = PolicyDocument.from_dir(policies).with_file(
        SIGNING_FILE, "schema_version: 1\nkeys: {release-2026: keys/release-2026.pub.pem}\n"
        "channels: {production: {required: true, keys: [release-2026]}}\n").with_file(
        "signing/keys/release-2026.pub.pem", public.decode())
    seed(any_store, document, acting=people.seeder(ME))
    release = Releases(any_store, tmp_path / "scratch").release()
    weights = release.binding.weights
    invoke("sign", f"{weights.repo_id}@{weights.commit}", "--signing-key", str(private),
           env=any_env)
    invoke("sign", release.id, "--signing-key", str(private), env=any_env)
    refused = invoke("verify", "--signature", release.id, expect=9, env=any_env)
    assert SIGNING_FILE in refused.stderr and "k3a trust migrate" in refused.stderr

    dry = invoke("trust", "migrate", "--dry-run", "--json", env=any_env).json
    (step,) = dry["families"]["release keys"]
    assert step.startswith("propose version 1 (") and "(release-2026, " in step
    invoke("trust", "migrate", env=any_env)
    policy = in_force(any_store)
    assert not [rel for rel in policy.document.files if rel.startswith("signing/")]
    named = policy.document.identities
    assert named.identities["release-2026"].roles == ["release"]
    assert named.release_channels["production"].identities == ["release-2026"]
    verified = invoke("verify", "--signature", release.id, "--channel", "production",
                      env=any_env)
    assert "release-2026" in verified.stdout
    assert "nothing to migrate" in invoke("trust", "migrate", env=any_env).stdout


def test_a_migrated_release_key_joins_its_holder_or_takes_a_free_name(policies):
    """One key is one identity: a trusted key some identity already holds gives that identity
    the release role; a key whose name an identity of another key has is named by its key
    id; the channel rule names whichever identity each key became."""
    held, named_after = (ec.generate_private_key(ec.SECP256R1()).public_key() for _ in range(2))
    pem = {name: key.public_bytes(serialization.Encoding.PEM,
                                  serialization.PublicFormat.SubjectPublicKeyInfo).decode()
           for name, key in (("held", held), ("rita", named_after))}
    someone_else = people.signer_of("rita")
    document = PolicyDocument.from_dir(policies).with_file("identities.yaml", identities_yaml(
        Identities(identities={
            "ops": Identity(roles=["review"], keys=[KeyEntry.of(held)]),
            "rita": Identity(roles=["review"], keys=[KeyEntry.for_signer(someone_else)]),
            "rita-release": Identity(roles=["review"], keys=[
                KeyEntry.for_signer(people.signer_of("rita-release"))])})))
    for name, text in pem.items():
        document = document.with_file(f"signing/keys/{name}.pem", text)
    document = document.with_file(SIGNING_FILE, "schema_version: 1\nkeys: {held: keys/held.pem, "
                                  "rita: keys/rita.pem}\nchannels: {production: {keys: [held, "
                                  "rita]}}\n")
    after = migrated(document).identities
    by_id = f"release-{KeyEntry.of(named_after).id}"
    assert after.identities["ops"].roles == ["review", "release"]
    assert after.identities[by_id].roles == ["release"]
    assert after.identities["rita"].roles == ["review"]
    assert after.release_channels["production"].identities == sorted(["ops", by_id])
