"""Stores older than signing (k3artifacts/migration, policy/migrate.py, releases/
migrate_channels.py), on a file store and on SeaweedFS: read as found where their policy says
so, never moved on, until `k3a trust migrate` vouches for their histories under a root
identity's signature; then verified like any other, old entries included."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from k3artifacts.canonical import canonical_json
from k3artifacts.cli import cli
from k3artifacts.migration.registry import MIGRATORS
from k3artifacts.policy.actor import Actor
from k3artifacts.policy.document import PolicyDocument
from k3artifacts.policy.record import (
    POINTER_KEY,
    LegacyPointer,
    PolicyChange,
    change_key,
    changes,
    in_force,
    store_document,
)
from k3artifacts.releases.channels import ChannelPointer, HistoryEntry, history, history_key
from k3artifacts.releases.channels import pointer_key as channel_key
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.pins import load_pin
from k3artifacts.trust.root import root_key
from tests.fixtures.people import ME
from tests.support.releases import Releases

OLD = Actor(name="alice", source="os-user")
T0 = datetime(2026, 1, 5, tzinfo=UTC)


@pytest.fixture(params=["file", pytest.param("seaweed", marks=pytest.mark.s3)])
def store(request, tmp_path):
    if request.param == "file":
        return FileStore(tmp_path / "store")
    return request.getfixturevalue("seaweed_store")


@pytest.fixture
def env(request, store, k3a_env):
    base = dict(k3a_env, K3A_STORE=store.url)
    if not isinstance(store, FileStore):
        base.update(request.getfixturevalue("seaweed").env)
        base.pop("AWS_SESSION_TOKEN", None)  # a moto server's fake one, if one ran before
    return base


def k3a(env, *args, expect=0):
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == expect, (result.exit_code, result.stdout, result.stderr)
    return result


def _entry(channel, seq, tuple_id, before, digest, when):
    return HistoryEntry(channel=channel, seq=seq, action="promote", tuple_id=tuple_id,
                        previous_tuple_id=before, who="alice", who_source="os-user",
                        when=when, why=f"move #{seq}", policy_digest=digest, policy_version=1)


def old_store(store, policies, tmp_path, *, read_before_migration=True):
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
        store_document(store, document)
    v1 = PolicyChange(version=1, digest=first.digest, action="seed", by=OLD, at=T0)
    v2 = PolicyChange(version=2, digest=second.digest, previous_digest=first.digest,
                      action="change", by=OLD, at=T0 + timedelta(hours=1), approved_by=OLD)
    store.create(change_key(1), canonical_json(v1))
    store.replace(POINTER_KEY, canonical_json(LegacyPointer(version=2, digest=second.digest,
                                                            change=v2)), None)
    releases = Releases(store, tmp_path / "scratch")
    a, b, c = releases.release(), releases.release(), releases.release()
    staged = [_entry("staging", 1, a.id, None, first.digest, T0),
              _entry("staging", 2, b.id, a.id, first.digest, T0 + timedelta(hours=2))]
    for entry in staged:
        store.create(history_key("staging", entry.seq), canonical_json(entry))
    store.replace(channel_key("staging"), canonical_json(ChannelPointer.for_entry(staged[-1])),
                  None)
    live = _entry("production", 1, c.id, None, first.digest, T0 + timedelta(hours=3))
    store.replace(channel_key("production"), canonical_json(ChannelPointer.for_entry(live)),
                  None)
    return releases, (a, b, c)


def test_an_old_store_is_read_as_found_and_never_moved_on(store, env, policies, tmp_path):
    _, (a, b, c) = old_store(store, policies, tmp_path)
    assert "policy version 2" in k3a(env, "policy", "show").stdout
    assert len(json.loads(k3a(env, "history", "staging", "--json").stdout)) == 2
    assert [e.tuple_id for e in history(store, "production")] == [c.id]
    k3a(env, "render", "staging", "--target", "eks")
    for args in (["rollback", "staging"], ["promote", a.id, "staging"],
                 ["policy", "propose", str(policies)]):
        refused = k3a(env, *args, expect=9)
        assert "predates signed records" in refused.stderr, args
        assert "k3a trust migrate" in refused.stderr
    assert store.read(root_key(1)) is None and load_pin(store.url) is None


def test_an_old_store_whose_policy_says_so_is_not_read(store, env, policies, tmp_path):
    old_store(store, policies, tmp_path, read_before_migration=False)
    refused = k3a(env, "policy", "show", expect=4)
    assert "refused (unsigned)" in refused.stderr and "k3a trust migrate" in refused.stderr


def test_migrate_vouches_for_the_histories_and_signs_the_next_version(store, env, policies,
                                                                      tmp_path):
    releases, (a, b, c) = old_store(store, policies, tmp_path)
    dry = json.loads(k3a(env, "trust", "migrate", "--dry-run", "--json").stdout)
    assert dry["first_use"] and set(dry["families"]) == {m.family for m in MIGRATORS}
    assert dry["families"]["policy"][0] == ("vouch for policy versions 1 to 2 (unsigned) with "
                                            "a checkpoint")
    assert sorted(dry["families"]["channels"]) == [
        "vouch for channel production's entries 1 to 1 (unsigned) with a checkpoint",
        "vouch for channel staging's entries 1 to 2 (unsigned) with a checkpoint"]
    assert store.read(root_key(1)) is None  # a dry run writes nothing

    migrated = k3a(env, "trust", "migrate")
    assert "did make your key" in migrated.stdout
    policy = in_force(store)
    assert (policy.version, policy.chain.head.entry.action) == (3, "migrate")
    assert list(policy.document.identities.identities) == [ME]
    assert [(r.change.version, sorted(r.signers)) for r in changes(store)] == [
        (1, []), (2, []), (3, [ME])]
    assert [e.tuple_id for e in history(store, "staging")] == [a.id, b.id]
    assert [e.tuple_id for e in history(store, "production")] == [c.id]

    # Moves go on from the vouched entries, signed; a vouched entry is a rollback target.
    back = json.loads(k3a(env, "rollback", "staging", "--json").stdout)
    assert (back["tuple_id"], back["entry"]["seq"], back["entry"]["who"]) == (a.id, 3, ME)
    assert [e.seq for e in history(store, "staging")] == [1, 2, 3]
    assert "nothing to migrate" in k3a(env, "trust", "migrate").stdout

    # A vouched entry edited after the fact is refused as a signed one would be.
    record = json.loads(store.read(history_key("staging", 1)).data)
    record["why"] = "rewritten"
    if isinstance(store, FileStore):
        path = store.local_path(history_key("staging", 1))
        path.chmod(0o644)
        path.write_bytes(canonical_json(record))
    else:
        store.client.put_object(Bucket=store.bucket, Key=store.key(history_key("staging", 1)),
                                Body=canonical_json(record))
    refused = k3a(env, "history", "staging", expect=4)
    assert "refused (edit)" in refused.stderr and "checkpoint vouches for" in refused.stderr


def test_a_history_that_does_not_hold_together_is_not_vouched_for(store, env, policies,
                                                                  tmp_path):
    _, (a, _, _) = old_store(store, policies, tmp_path)
    # staging's pointer set back to #1 by hand: its log goes on to #2.
    entry = HistoryEntry.model_validate_json(store.read(history_key("staging", 1)).data)
    store.replace(channel_key("staging"), canonical_json(ChannelPointer.for_entry(entry)),
                  store.read(channel_key("staging")).token)
    refused = k3a(env, "trust", "migrate", expect=4)
    assert "set back by hand" in refused.stderr
    assert store.read(root_key(1)) is None  # refused before anything was written
