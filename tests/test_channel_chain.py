"""Channel histories as signed chains (k3artifacts/releases/channels.py), on a file store and on
SeaweedFS: every reader (render, pull, history, smoke, gates, promote, rollback, channel list)
verifies the whole chain and refuses, by name, a forged next pointer, an edited, deleted or
forked entry; rollback takes its targets from the verified chain alone."""

from __future__ import annotations

import json

import pytest

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.releases.channels import (
    ENTRY_KIND,
    ChannelPointer,
    history,
    history_key,
    pointer_key,
)
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.trust.chain import Link
from k3artifacts.trust.envelope import sign_record
from tests.fixtures import people
from tests.fixtures.any_store import overwrite, remove
from tests.fixtures.moves import promote, use_policy
from tests.fixtures.releases import REVIEWER
from tests.support.cli import invoke
from tests.support.releases import Releases

CHANNEL = "staging"


@pytest.fixture
def releases(any_store, tmp_path):
    return Releases(any_store, tmp_path / "scratch")


@pytest.fixture
def served(any_store, releases, policies):
    """Three tuples moved onto staging in turn by ci (entries #1, #2, #3)."""
    moved = []
    for _ in range(3):
        release = releases.release()
        use_policy(any_store, policies)
        review_license(any_store, release.id, by=people.person(REVIEWER))
        review_code(any_store, release.id, by=people.person(REVIEWER))
        promote(any_store, release.id, CHANNEL, actor="ci")
        moved.append(release)
    assert [e.seq for e in history(any_store, CHANNEL)] == [1, 2, 3]
    return moved


def refused_by_every_reader(any_env, served, tmp_path, reason: str, where: str) -> None:
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
                         signer=people.signer_of("mallory"), identity="ci")
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
                         signer=people.signer_of("ci"), identity="ci"))
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
        "holds entries up to #3: the pointer was removed")
