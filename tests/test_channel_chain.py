"""Channel histories as signed chains (k3artifacts/releases/channels.py), on a file store and on
SeaweedFS: every reader (render, pull, history, smoke, gates, promote, rollback, channel list)
verifies the chain (a client that never read it, to its start or its newest checkpoint; one
that did, from the head it remembers: only what is new) and refuses, by name, a forged next
pointer, an edited, deleted or forked entry, and a rewind or fork behind the head it saw;
rollback takes its targets from the verified chain alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.policy.record import in_force
from k3artifacts.policy.signed import store_id
from k3artifacts.releases.channels import (
    ENTRY_KIND,
    ChannelPointer,
    HistoryEntry,
    commit_move,
    history,
    history_key,
    pointer_key,
    read_state,
)
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.chain import Link
from k3artifacts.trust.envelope import sign_record
from tests.fixtures import people
from tests.fixtures.any_store import overwrite, remove
from tests.fixtures.channel_moves import CHANNEL, fresh_reader
from tests.support.cli import invoke
from tests.support.clients import fresh_config


@pytest.fixture
def releases(any_releases):
    return any_releases


def refused_by_every_reader(any_env, served, tmp_path, reason: str, where: str) -> None:
    """Every reader of a client that never read the channel refuses: it verifies the whole
    history (there is no checkpoint yet)."""
    readers(fresh_reader(any_env, tmp_path), served, tmp_path, reason, where)


def readers(any_env, served, tmp_path, reason: str, where: str) -> None:
    """Every reader of the channel, as the client of ``any_env``, refuses."""
    first, _, third = served
    cache = tmp_path / "node-cache"
    for args in (["render", CHANNEL, "--target", "eks"],
                 ["pull", CHANNEL, "--to", str(cache)],
                 ["history", CHANNEL],
                 ["channel", "list"],
                 ["smoke", "http://127.0.0.1:9", "--tuple", CHANNEL],
                 ["gates", third.id, CHANNEL],
                 ["promote", third.id, CHANNEL],
                 ["rollback", CHANNEL],
                 ["rollback", CHANNEL, "--to", first.id]):
        refused = invoke(*args, expect=4, env=any_env)
        assert f"{where}: refused ({reason})" in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr
    assert not (cache / "models").exists()


def _body(any_store, seq: int) -> dict:
    return json.loads(any_store.read(history_key(CHANNEL, seq)).data)["body"]


def test_a_forged_next_pointer_is_refused(any_store, any_env, served, tmp_path):
    """The pointer written in the shape of the next move, as if its mover had died before
    logging it: the old unsigned shape, then signed by a key the policy does not trust."""
    first, _, third = served
    head = _body(any_store, 3)
    entry = {**head["entry"], "seq": 4, "action": "rollback", "tuple_id": first.id,
             "previous_tuple_id": third.id}
    unsigned = ChannelPointer.model_validate({
        "channel": CHANNEL, "tuple_id": first.id, "seq": 4, "updated_at": entry["when"],
        "updated_by": "ci", "entry": entry})
    any_store.replace(pointer_key(CHANNEL), canonical_json(unsigned),
                  any_store.read(pointer_key(CHANNEL)).token)
    refused_by_every_reader(any_env, served, tmp_path, "unsigned", pointer_key(CHANNEL))
    link = Link(seq=4, previous=_digest(any_store, 3), entry=entry)
    forged = sign_record(key=history_key(CHANNEL, 4), kind=ENTRY_KIND, body=link,
                         signer=people.signer_of("mallory"), identity="ci",
                         store_id=store_id(any_store))
    any_store.replace(pointer_key(CHANNEL), forged, any_store.read(pointer_key(CHANNEL)).token)
    refused_by_every_reader(any_env, served, tmp_path, "untrusted-key", pointer_key(CHANNEL))


def _digest(any_store, seq: int) -> str:
    return canonical_digest(_body(any_store, seq))


def test_an_edited_entry_is_refused_and_rollback_does_not_follow_it(any_store, any_env, served,
                                                                     releases, tmp_path):
    """Entry #2 rewritten to name another tuple (one that never passed staging's gates): a
    rollback would have gone there."""
    record = json.loads(any_store.read(history_key(CHANNEL, 2)).data)
    stranger = releases.release()  # one that never served staging
    record["body"]["entry"]["tuple_id"] = stranger.id
    overwrite(any_store, history_key(CHANNEL, 2), canonical_json(record))
    refused_by_every_reader(any_env, served, tmp_path, "edit", history_key(CHANNEL, 2))
    invoke("rollback", CHANNEL, "--to", stranger.id, expect=4, env=any_env)


def test_a_deleted_entry_is_refused_and_named(any_store, any_env, served, tmp_path):
    remove(any_store, history_key(CHANNEL, 1))
    refused_by_every_reader(any_env, served, tmp_path, "gap", history_key(CHANNEL, 1))


def test_a_forked_entry_is_refused(any_store, any_env, served, tmp_path):
    """Entry #2 replaced by another one validly signed by ci (who may move staging): it is not
    the entry #3 follows."""
    body = _body(any_store, 2)
    body["entry"]["why"] = "another move #2"
    overwrite(any_store, history_key(CHANNEL, 2),
             sign_record(key=history_key(CHANNEL, 2), kind=ENTRY_KIND, body=body,
                         signer=people.signer_of("ci"), identity="ci",
                         store_id=store_id(any_store)))
    refused_by_every_reader(any_env, served, tmp_path, "fork", history_key(CHANNEL, 2))


def test_rollback_targets_come_from_the_verified_chain(any_store, any_env, served, releases):
    first, second, third = served
    back = invoke("rollback", CHANNEL, "--json", env=any_env).json
    assert (back["tuple_id"], back["entry"]["seq"]) == (second.id, 4)
    stranger = releases.release()  # one that never served staging
    never = invoke("rollback", CHANNEL, "--to", stranger.id, expect=7, env=any_env)
    assert "has never been on channel staging" in never.stderr
    entries = history(any_store, CHANNEL)
    assert [e.tuple_id for e in entries] == [first.id, second.id, third.id, second.id]
    assert entries[-1].who == people.ME


def test_a_deleted_pointer_is_noticed_by_channel_list(any_store, any_env, served, tmp_path):
    """The issue's case: `channel list` listed pointers only, so a channel whose pointer was
    deleted (its history still there) was silently left out, exit 0. Every reader, the list
    too, finds the history and refuses the channel by name."""
    remove(any_store, pointer_key(CHANNEL))
    refused = invoke("channel", "list", "--json", expect=4, env=any_env)
    assert refused.json["error"] == (
        f"{pointer_key(CHANNEL)}: refused (rewound): channel {CHANNEL} has no head, but its log "
        "holds entries: the pointer was removed")
def _rewind(any_store) -> None:
    """The newest entry deleted and entry #2, a validly signed move, copied over the pointer:
    a history whole as far as it goes."""
    remove(any_store, history_key(CHANNEL, 3))
    overwrite(any_store, pointer_key(CHANNEL), any_store.read(history_key(CHANNEL, 2)).data)


def test_a_rewound_channel_is_refused_by_every_reader_that_saw_the_newer_head(
        any_store, any_env, served, tmp_path):
    """This client moved staging to #3 (and so verified it): after the rewind every one of
    its readers refuses, naming the channel and both heads. A client that never read the
    channel sees only a shorter history (the store's freshness bounds that one)."""
    seen = _digest(any_store, 3)
    _rewind(any_store)
    readers(any_env, served, tmp_path, "rewound", pointer_key(CHANNEL))
    refused = invoke("render", CHANNEL, "--target", "eks", expect=4, env=any_env).stderr
    assert f"channel staging: this client verified #3 ({seen[:12]}) before; the store now " \
        "shows #2 (" in refused


def test_a_history_forked_past_what_a_reader_saw_is_refused(any_store, any_env, served,
                                                            tmp_path):
    """#3 replaced by another move validly signed by ci, pointer and log alike: a client that
    verified the first #3 refuses the second, naming both."""
    body = _body(any_store, 3)
    body["entry"]["why"] = "another move #3"
    forked = sign_record(key=history_key(CHANNEL, 3), kind=ENTRY_KIND, body=body,
                         signer=people.signer_of("ci"), identity="ci",
                         store_id=store_id(any_store))
    overwrite(any_store, history_key(CHANNEL, 3), forked)
    overwrite(any_store, pointer_key(CHANNEL), forked)
    readers(any_env, served, tmp_path, "fork", history_key(CHANNEL, 3))


def _moves(any_store, served, count: int) -> None:
    """``count`` more moves of staging between the served tuples, committed as a promotion
    commits them (its gates are another test's subject)."""
    policy = in_force(any_store)
    ci = people.person("ci")
    for _ in range(count):
        state = read_state(any_store, CHANNEL)
        after = next(r.id for r in served if r.id != state.tuple_id)
        commit_move(any_store, state, HistoryEntry(
            channel=CHANNEL, seq=state.next_seq, action="promote", tuple_id=after,
            previous_tuple_id=state.tuple_id, who="ci", who_source="key",
            when=datetime.now(UTC), policy_digest=policy.digest,
            policy_version=policy.version), acting=ci)


def _counted(store, calls: list[str]) -> None:
    """Each request ``store`` makes appended to ``calls``: botocore's own for S3; each read
    and listing the file store is asked for."""
    if isinstance(store, FileStore):
        for name in ("read", "list_keys"):
            method = getattr(store, name)
            setattr(store, name, lambda *a, _m=method, _n=name, **k: calls.append(_n) or _m(*a, **k))
    else:
        store.client.meta.events.register(
            "before-call.s3", lambda model, **_: calls.append(model.name))


def test_a_remembered_reader_reads_what_is_new_a_fresh_one_from_the_checkpoint(
        any_store, served, tmp_path, monkeypatch):
    """The store requests one read of the channel makes: a reader that verified the head
    reads the same few whatever the history's length. A fresh reader reads back to the newest
    checkpoint (every 16 moves), then remembers."""
    calls: list[str] = []
    _counted(any_store, calls)

    def cost(**kwargs) -> int:
        calls.clear()
        read_state(any_store, CHANNEL, **kwargs)
        return len(calls)

    short = cost()
    _moves(any_store, served, 21)
    assert [e.seq for e in read_state(any_store, CHANNEL).entries] == [24]
    assert cost() == short
    monkeypatch.setenv("XDG_CONFIG_HOME", str(fresh_config(tmp_path / "home" / "config",
                                                           tmp_path / "fresh")))
    assert cost() == short + 8  # entries #23 down to #16, the checkpoint's
    assert [e.seq for e in read_state(any_store, CHANNEL).entries] == [24]



def _propose_and_apply(env, directory) -> tuple[int, str]:
    request = invoke("policy", "propose", str(directory), "--json", env=env).json
    applied = invoke("policy", "apply", request["id"], "--json", env=env).json
    return applied["version"], applied["digest"]


@pytest.fixture
def restored(any_env, releases, tmp_path):
    """`k3a policy init`, staging promoted (#1, v1), a field tightened (v2) and the change
    undone (v3: v1's text, one digest for two versions), staging promoted again (#2, v3).
    Returns the two tuples and each version's digest."""
    first, second = releases.release(), releases.release()
    seeded = invoke("policy", "init", "--json", env=any_env).json
    for release in (first, second):
        invoke("review", "license", release.id, env=any_env)
        invoke("review", "code", release.id, env=any_env)
    invoke("promote", first.id, CHANNEL, env=any_env)
    original = tmp_path / "original"
    invoke("policy", "show", "--out", str(original), env=any_env)
    stricter = tmp_path / "stricter"
    invoke("policy", "show", "--out", str(stricter), env=any_env)
    gates_file = stricter / "promotion-gates.yaml"
    gates_file.write_text(gates_file.read_text().replace("min_pass_rate: 0.95",
                                                         "min_pass_rate: 0.99", 1))
    tightened = _propose_and_apply(any_env, stricter)
    assert tightened[0] == 2
    assert _propose_and_apply(any_env, original) == (3, seeded["digest"])
    invoke("promote", second.id, CHANNEL, env=any_env)
    return first, second, {1: seeded["digest"], 2: tightened[1], 3: seeded["digest"]}


def test_a_policy_restored_to_an_earlier_text_still_verifies_every_entry(
        any_env, restored, tmp_path):
    """The entries v1 judged and the ones v3 judges each verify as their own (version,
    digest) pair, for the client that moved them and for one that never read the store."""
    first, second, _ = restored
    for env in (any_env, fresh_reader(any_env, tmp_path)):
        shown = invoke("channel", "history", CHANNEL, "--json", env=env).json
        assert [(e["policy_version"], e["tuple_id"]) for e in shown] == [
            (1, first.id), (3, second.id)], shown
        invoke("render", CHANNEL, "--target", "eks", env=env)
        invoke("gates", second.id, CHANNEL, env=env)


@pytest.mark.parametrize("version,judged_by,refusal", [
    (2, 1, "names policy v2, not the version of its digest"),
    (1, 1, "names policy v1, out of order (#2 names v3)"),
])
def test_an_entry_naming_a_version_not_its_digest_or_out_of_order_is_refused(
        any_store, any_env, restored, tmp_path, version, judged_by, refusal):
    """Signed by an identity the policy trusts to promote, so only the pair it names, checked
    against the policy history, can refuse it."""
    first, second, digests = restored
    state = read_state(any_store, CHANNEL)
    commit_move(any_store, state, HistoryEntry(
        channel=CHANNEL, seq=3, action="promote", tuple_id=first.id,
        previous_tuple_id=second.id, who=people.ME, who_source="key", when=datetime.now(UTC),
        policy_digest=digests[judged_by], policy_version=version),
        acting=people.person(people.ME))
    for env in (any_env, fresh_reader(any_env, tmp_path)):
        refused = invoke("channel", "history", CHANNEL, expect=4, env=env)
        assert f"{history_key(CHANNEL, 3)}: refused (edit)" in refused.stderr, refused.stderr
        assert refusal in refused.stderr
