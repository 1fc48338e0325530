"""Channel histories as signed chains (k3artifacts/releases/channels.py), on a file store and on
SeaweedFS: every reader (render, pull, history, smoke, gates, promote, rollback, channel list)
verifies the whole chain and refuses, by name, a forged next pointer, an edited, deleted or
forked entry; rollback takes its targets from the verified chain alone."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from k3artifacts.canonical import canonical_digest, canonical_json
from k3artifacts.cli import cli
from k3artifacts.releases.channels import (
    ENTRY_KIND,
    ChannelPointer,
    history,
    history_key,
    pointer_key,
)
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.stores.file import FileStore
from k3artifacts.trust.chain import Link
from k3artifacts.trust.envelope import sign_record
from tests.fixtures import people
from tests.fixtures.moves import promote
from tests.fixtures.releases import REVIEWER
from tests.support.releases import Releases

CHANNEL = "staging"


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


@pytest.fixture
def releases(store, tmp_path):
    return Releases(store, tmp_path / "scratch")


@pytest.fixture
def served(store, releases, policies):
    """Three tuples moved onto staging in turn by ci (entries #1, #2, #3)."""
    moved = []
    for _ in range(3):
        release = releases.release()
        review_license(store, release.id, by=REVIEWER, by_source="key")
        review_code(store, release.id, by=REVIEWER, by_source="key")
        promote(store, release.id, CHANNEL, actor="ci", policies_dir=policies)
        moved.append(release)
    assert [e.seq for e in history(store, CHANNEL)] == [1, 2, 3]
    return moved


def k3a(env, *args, expect=0):
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == expect, (result.exit_code, result.stdout, result.stderr)
    return result


def refused_by_every_reader(env, served, tmp_path, reason: str, where: str) -> None:
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
        refused = k3a(env, *args, expect=4)
        assert f"{where}: refused ({reason})" in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr
    assert not (cache / "models").exists()


def _rewrite(store, key: str, data: bytes) -> None:
    """Someone with write access to the store replaces a record k3a writes once."""
    if isinstance(store, FileStore):
        path = store.local_path(key)
        path.chmod(0o644)
        path.write_bytes(data)
    else:
        store.client.put_object(Bucket=store.bucket, Key=store.key(key), Body=data)


def _delete(store, key: str) -> None:
    if isinstance(store, FileStore):
        store.local_path(key).unlink()
    else:
        store.client.delete_object(Bucket=store.bucket, Key=store.key(key))


def _body(store, seq: int) -> dict:
    return json.loads(store.read(history_key(CHANNEL, seq)).data)["body"]


def test_a_forged_next_pointer_is_refused(store, env, served, tmp_path):
    """The pointer written in the shape of the next move, as if its mover had died before
    logging it: the old unsigned shape, then signed by a key the policy does not trust."""
    first, _, third = served
    head = _body(store, 3)
    entry = {**head["entry"], "seq": 4, "action": "rollback", "tuple_id": first.id,
             "previous_tuple_id": third.id}
    unsigned = ChannelPointer.model_validate({
        "channel": CHANNEL, "tuple_id": first.id, "seq": 4, "updated_at": entry["when"],
        "updated_by": "ci", "entry": entry})
    store.replace(pointer_key(CHANNEL), canonical_json(unsigned),
                  store.read(pointer_key(CHANNEL)).token)
    refused_by_every_reader(env, served, tmp_path, "unsigned", pointer_key(CHANNEL))
    link = Link(seq=4, previous=_digest(store, 3), entry=entry)
    forged = sign_record(key=history_key(CHANNEL, 4), kind=ENTRY_KIND, body=link,
                         signer=people.signer_of("mallory"), identity="ci")
    store.replace(pointer_key(CHANNEL), forged, store.read(pointer_key(CHANNEL)).token)
    refused_by_every_reader(env, served, tmp_path, "untrusted-key", pointer_key(CHANNEL))


def _digest(store, seq: int) -> str:
    return canonical_digest(_body(store, seq))


def test_an_edited_entry_is_refused_and_rollback_does_not_follow_it(store, env, served,
                                                                     releases, tmp_path):
    """Entry #2 rewritten to name another tuple (one that never passed staging's gates): a
    rollback would have gone there."""
    record = json.loads(store.read(history_key(CHANNEL, 2)).data)
    stranger = releases.release()  # one that never served staging
    record["body"]["entry"]["tuple_id"] = stranger.id
    _rewrite(store, history_key(CHANNEL, 2), canonical_json(record))
    refused_by_every_reader(env, served, tmp_path, "edit", history_key(CHANNEL, 2))
    k3a(env, "rollback", CHANNEL, "--to", stranger.id, expect=4)


def test_a_deleted_entry_is_refused_and_named(store, env, served, tmp_path):
    _delete(store, history_key(CHANNEL, 1))
    refused_by_every_reader(env, served, tmp_path, "gap", history_key(CHANNEL, 1))


def test_a_forked_entry_is_refused(store, env, served, tmp_path):
    """Entry #2 replaced by another one validly signed by ci (who may move staging): it is not
    the entry #3 follows."""
    body = _body(store, 2)
    body["entry"]["why"] = "another move #2"
    _rewrite(store, history_key(CHANNEL, 2),
             sign_record(key=history_key(CHANNEL, 2), kind=ENTRY_KIND, body=body,
                         signer=people.signer_of("ci"), identity="ci"))
    refused_by_every_reader(env, served, tmp_path, "fork", history_key(CHANNEL, 2))


def test_rollback_targets_come_from_the_verified_chain(store, env, served, releases):
    first, second, third = served
    back = json.loads(k3a(env, "rollback", CHANNEL, "--json").stdout)
    assert (back["tuple_id"], back["entry"]["seq"]) == (second.id, 4)
    stranger = releases.release()  # one that never served staging
    never = k3a(env, "rollback", CHANNEL, "--to", stranger.id, expect=7)
    assert "has never been on channel staging" in never.stderr
    entries = history(store, CHANNEL)
    assert [e.tuple_id for e in entries] == [first.id, second.id, third.id, second.id]
    assert entries[-1].who == people.ME
