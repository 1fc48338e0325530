"""A history that cannot be rewritten (k3artifacts/trust/chain.py): appended and verified to
its start on a file store and on SeaweedFS, and every rewrite someone with write access to the
store could try refused by name: a gap, an edit, a fork, a deleted entry, a rewound head, a
forged next pointer."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ConfigDict

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import Conflict, UntrustedRecord
from k3artifacts.migration.histories import based
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.chain import (
    Chain,
    ChainLayout,
    Mark,
    append,
    checkpoint,
    verify_chain,
)
from k3artifacts.trust.envelope import Bound, sign_record
from tests.fixtures.releases import ATOMIC_STORES
from tests.trust_helpers import identities, signer

LAYOUT = ChainLayout(
    name="channel production",
    pointer_key="releases/channels/production.json",
    entries_prefix="releases/channels/production/history/",
    entry_kind="channel-entry",
    checkpoint_key="releases/channels/production/checkpoint.json",
)
ALICE, BOB, MALLORY = signer(), signer("ecdsa-p384"), signer()
KEYRING = identities(alice=(ALICE, ["promote"]), bob=(BOB, ["review"])).keyring()
#: These histories are the chain's alone, in a store whose root has no id (binding to a store
#: id is tested with real roots: tests/test_store_binding.py).
UNBOUND = Bound(None)


class Move(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tuple_id: str
    why: str


def read(store, last_seen: Mark | None = None) -> Chain[Move]:
    return verify_chain(store, LAYOUT, Move, keyring=KEYRING, roles=["promote"], bound=UNBOUND,
                        last_seen=last_seen)


def grow(store, *tuples: str, by=ALICE, name="alice") -> Chain[Move]:
    chain = read(store)
    for tuple_id in tuples:
        chain = append(store, chain, Move(tuple_id=tuple_id, why="test"), signer=by,
                       identity=name)
    return chain


@pytest.fixture(params=ATOMIC_STORES)
def store(request, tmp_path):
    if request.param == "seaweed":
        return request.getfixturevalue("seaweed_store")
    return FileStore(tmp_path / "store")


def raw(store, key: str) -> bytes:
    found = store.read(key)
    assert found is not None, key
    return found.data


def put(store, key: str, data: bytes) -> None:
    found = store.read(key)
    store.replace(key, data, None if found is None else found.token)


def refused(store, reason: str, **kwargs) -> UntrustedRecord:
    with pytest.raises(UntrustedRecord) as caught:
        read(store, **kwargs)
    assert caught.value.reason == reason, str(caught.value)
    return caught.value


def test_a_history_verifies_to_its_start_and_returns_its_entries(store):
    assert read(store).entries == () and read(store).head is None
    chain = grow(store, "t1", "t2", "t3")
    # A reader that verified the head before has nothing new to walk.
    assert [e.seq for e in read(store, last_seen=chain.mark).entries] == [3]
    again = read(store)
    assert [e.entry.tuple_id for e in again.entries] == ["t1", "t2", "t3"]
    assert [e.seq for e in again.entries] == [1, 2, 3]
    assert again.entries[0].previous is None
    assert all(e.previous == p.digest
               for p, e in zip(again.entries, again.entries[1:], strict=False))
    assert again.head.signers == {"alice"} and again.mark == chain.mark
    # A move made against a head that moved since is refused whole: nothing was written.
    stale = again
    grow(store, "t4")
    with pytest.raises(Conflict):
        append(store, stale, Move(tuple_id="t5", why="late"), signer=ALICE, identity="alice")
    assert [e.entry.tuple_id for e in read(store).entries] == ["t1", "t2", "t3", "t4"]


def test_a_mover_that_died_before_logging_loses_nothing(store):
    grow(store, "t1", "t2")
    # The state a mover leaves when it dies between swapping the pointer and logging.
    store.delete(LAYOUT.entry_key(2))
    chain = read(store)
    assert [e.entry.tuple_id for e in chain.entries] == ["t1", "t2"] and not chain.head_logged
    grow(store, "t3")  # the next mover logs entry 2 (its maker's own signed bytes) first
    assert store.read(LAYOUT.entry_key(2)) is not None
    assert [e.entry.tuple_id for e in read(store).entries] == ["t1", "t2", "t3"]


def test_a_deleted_entry_is_a_gap(store):
    grow(store, "t1", "t2", "t3")
    store.delete(LAYOUT.entry_key(2))
    assert "#2" in str(refused(store, "gap"))


def test_the_deleted_first_entry_is_a_gap(store):
    grow(store, "t1", "t2")
    store.delete(LAYOUT.entry_key(1))
    refused(store, "gap")


def test_an_edited_entry_is_refused(store):
    grow(store, "t1", "t2", "t3")
    record = json.loads(raw(store, LAYOUT.entry_key(2)))
    record["body"]["entry"]["tuple_id"] = "t-never-gated"
    put(store, LAYOUT.entry_key(2), canonical_json(record))
    assert "tampered" in str(refused(store, "edit"))


def test_an_entry_rewritten_and_signed_by_another_key_is_refused(store):
    chain = grow(store, "t1", "t2", "t3")
    link = {"seq": 2, "previous": chain.entries[0].digest,
            "entry": {"tuple_id": "t-evil", "why": "rewritten"}}
    put(store, LAYOUT.entry_key(2), sign_record(key=LAYOUT.entry_key(2), kind="channel-entry",
                                                body=link, signer=MALLORY, identity="alice",
                                                store_id=None))
    assert "untrusted-key" in str(refused(store, "edit"))
    # By a key the policy knows, but not for moving channels.
    put(store, LAYOUT.entry_key(2), sign_record(key=LAYOUT.entry_key(2), kind="channel-entry",
                                                body=link, signer=BOB, identity="bob",
                                                store_id=None))
    assert "wrong-role" in str(refused(store, "edit"))


def test_an_entry_moved_to_another_place_is_refused(store):
    grow(store, "t1", "t2", "t3")
    put(store, LAYOUT.entry_key(2), raw(store, LAYOUT.entry_key(1)))
    assert "wrong-key" in str(refused(store, "edit"))


def test_a_validly_signed_entry_of_another_history_is_a_fork(store, tmp_path):
    grow(store, "t1", "t2", "t3")
    ours = raw(store, LAYOUT.entry_key(2))
    other = FileStore(tmp_path / "other")
    grow(other, "t1", "x2", "x3")  # signed by the same trusted key, for the same places
    put(store, LAYOUT.entry_key(2), raw(other, LAYOUT.entry_key(2)))
    assert "not the one entry #3 follows" in str(refused(store, "fork"))
    # The log's copy of the head is not the entry the pointer holds.
    put(store, LAYOUT.entry_key(2), ours)
    grow(other, "x4")
    grow(store, "t4")
    put(store, LAYOUT.entry_key(4), raw(other, LAYOUT.entry_key(4)))
    assert "not the one its pointer holds" in str(refused(store, "fork"))


def test_a_head_set_back_is_rewound(store):
    grow(store, "t1", "t2")
    older = raw(store, LAYOUT.pointer_key)
    grow(store, "t3")
    put(store, LAYOUT.pointer_key, older)  # the pointer of an earlier move, replayed
    assert "goes on to #3" in str(refused(store, "rewound"))


def test_a_removed_pointer_is_rewound(store):
    mark = grow(store, "t1", "t2").mark
    store.delete(LAYOUT.pointer_key)
    refused(store, "rewound")
    # Removing the log too leaves nothing to see, but not to a reader that saw it before.
    for seq in (1, 2):
        store.delete(LAYOUT.entry_key(seq))
    assert read(store).entries == ()
    refused(store, "rewound", last_seen=mark)


def test_a_head_set_back_with_the_newer_entries_deleted_is_rewound_for_a_reader_that_saw_them(
        store):
    grow(store, "t1", "t2")
    older = raw(store, LAYOUT.pointer_key)
    mark = grow(store, "t3").mark
    store.delete(LAYOUT.entry_key(3))
    put(store, LAYOUT.pointer_key, older)
    assert [e.entry.tuple_id for e in read(store).entries] == ["t1", "t2"]
    assert "verified #3 (" in str(refused(store, "rewound", last_seen=mark))


def test_a_history_rewritten_past_what_a_reader_saw_is_a_fork(store, tmp_path):
    mark = grow(store, "t1", "t2").mark
    other = FileStore(tmp_path / "other")
    grow(other, "t1", "x2", "x3")
    for seq in (2, 3):
        put(store, LAYOUT.entry_key(seq), raw(other, LAYOUT.entry_key(seq)))
    put(store, LAYOUT.pointer_key, raw(other, LAYOUT.pointer_key))
    assert [e.entry.tuple_id for e in read(store).entries] == ["t1", "x2", "x3"]
    assert "rewritten" in str(refused(store, "fork", last_seen=mark))


@pytest.mark.parametrize("forger, reason", [
    ("hand", "unsigned"), ("mallory", "untrusted-key"), ("bob", "wrong-role")])
def test_a_forged_next_pointer_is_refused(store, forger, reason):
    chain = grow(store, "t1", "t2")
    link = {"seq": 3, "previous": chain.head.digest,
            "entry": {"tuple_id": "t-unreviewed", "why": "the mover died"}}
    if forger == "hand":
        forged = canonical_json(link)
    else:
        key = {"mallory": MALLORY, "bob": BOB}[forger]
        forged = sign_record(key=LAYOUT.entry_key(3), kind="channel-entry", body=link,
                             signer=key, identity=forger, store_id=None)
    put(store, LAYOUT.pointer_key, forged)
    refused(store, reason)


def test_a_checkpoint_ends_the_walk_and_must_agree_with_the_history(store, tmp_path):
    chain = grow(store, "t1", "t2", "t3")
    assert checkpoint(store, read(store), signer=ALICE, identity="alice").seq == 3
    grow(store, "t4")
    # Entries before the checkpoint are no longer read (they may be signed by retired keys).
    store.delete(LAYOUT.entry_key(1))
    assert [e.entry.tuple_id for e in read(store).entries] == ["t3", "t4"]
    # A checkpoint vouching for another entry #3 is a fork; one past the head, a rewind.
    other = FileStore(tmp_path / "other")
    theirs = grow(other, "t1", "t2", "x3", "x4", "x5")
    checkpoint(other, theirs, signer=ALICE, identity="alice")
    put(store, LAYOUT.checkpoint_key, raw(other, LAYOUT.checkpoint_key))
    refused(store, "rewound")
    forged = sign_record(key=LAYOUT.checkpoint_key, kind="checkpoint",
                         body={"seq": 3, "digest": theirs.entries[2].digest},
                         signer=ALICE, identity="alice", store_id=None)
    put(store, LAYOUT.checkpoint_key, forged)
    refused(store, "fork")
    put(store, LAYOUT.checkpoint_key, sign_record(
        key=LAYOUT.checkpoint_key, kind="checkpoint",
        body={"seq": 3, "digest": chain.head.digest}, signer=MALLORY, identity="alice",
        store_id=None))
    refused(store, "untrusted-key")


BASED = ChainLayout(name=LAYOUT.name, pointer_key=LAYOUT.pointer_key,
                    entries_prefix=LAYOUT.entries_prefix, entry_kind=LAYOUT.entry_kind,
                    base_key="releases/channels/production/base.json")


def read_based(store) -> Chain[Move]:
    return verify_chain(store, BASED, Move, keyring=KEYRING, roles=["promote"], bound=UNBOUND)


def test_a_history_older_than_signing_is_read_only_through_its_signed_base(store):
    """Unsigned entries and pointer (a store older than signing) are refused, naming the
    migration; once migrated, the base's signed entries are read in place of the log's
    unsigned ones, and the base is held to its signature like any entry."""
    plain = [{"tuple_id": "t1", "why": "old"}, {"tuple_id": "t2", "why": "old"}]
    for seq, entry in enumerate(plain, start=1):
        put(store, BASED.entry_key(seq), canonical_json(entry))
    put(store, BASED.pointer_key, canonical_json({"seq": 2, "entry": plain[-1]}))
    with pytest.raises(UntrustedRecord) as caught:
        read_based(store)
    assert caught.value.reason == "unsigned" and "k3a trust migrate" in caught.value.hint

    based(store, BASED, plain, store.read(BASED.pointer_key).token, signer=ALICE,
          identity="alice", store_id=None)
    chain = read_based(store)
    assert [(e.entry.tuple_id, e.in_base, e.signers) for e in chain.entries] == [
        ("t1", True, {"alice"}), ("t2", True, {"alice"})]
    chain = append(store, chain, Move(tuple_id="t3", why="new"), signer=ALICE, identity="alice")
    # The log's unsigned copy is never read: edited, it changes nothing.
    put(store, BASED.entry_key(1), canonical_json({"tuple_id": "t9", "why": "rewritten"}))
    again = read_based(store)
    assert [(e.entry.tuple_id, e.in_base) for e in again.entries] == [
        ("t1", True), ("t2", True), ("t3", False)]
    assert again.mark == chain.mark

    record = json.loads(raw(store, BASED.base_key))
    record["body"]["links"][0]["entry"]["tuple_id"] = "t9"
    put(store, BASED.base_key, canonical_json(record))
    with pytest.raises(UntrustedRecord) as caught:
        read_based(store)
    assert caught.value.key == BASED.base_key and caught.value.reason == "tampered"
    # Signed anew by a key the keyring does not trust, it is no base either.
    put(store, BASED.base_key, sign_record(key=BASED.base_key, kind=BASED.base_kind,
                                           body=record["body"], signer=MALLORY,
                                           identity="alice", store_id=None))
    with pytest.raises(UntrustedRecord) as caught:
        read_based(store)
    assert caught.value.key == BASED.base_key and caught.value.reason == "untrusted-key"
