"""A team on one file store: what k3a writes is readable by the store's group (never wider for
others than the writer's umask), `k3a bootstrap file:///PATH --group GROUP` gives a store to a
group, and an account that may not read the store gets a named refusal, never a traceback."""

from __future__ import annotations

import grp
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from k3artifacts.errors import ConfigError
from k3artifacts.stores.file import FileStore
from k3artifacts.stores.file_bootstrap import share
from tests.fixtures.identities import TEAM_GROUP, k3a_as, pin_as
from tests.fixtures.moves import as_acting, seed_people
from tests.fixtures.people import ME
from tests.support.releases import Releases


@contextmanager
def umask(mask: int) -> Iterator[None]:
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory others may pass through (pytest's own are private, which bootstrap
    refuses: the group's members could not reach the store)."""
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="k3a-team-test-"))
    os.chmod(where, 0o755)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def own_group() -> str:
    return grp.getgrgid(os.getgid()).gr_name


@pytest.mark.parametrize("mask,record", [(0o000, 0o444), (0o022, 0o444), (0o077, 0o400)])
def test_records_and_pointers_follow_the_umask_read_only(tmp_path, mask, record):
    store = FileStore(tmp_path / "store")
    with umask(mask):
        store.create("releases/a/record.json", b"{}")
        store.replace("releases/a/pointer.json", b"{}", None)
    assert mode(store.root / "releases/a/record.json") == record
    # A pointer is replaced by renaming a new file over it: nobody writes one in place.
    assert mode(store.root / "releases/a/pointer.json") == record


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_on_a_teams_store_the_group_reads_records_and_adds_to_directories(reachable, mask):
    store = FileStore(reachable / "store")
    report = share(store.url, own_group())
    assert report.created and mode(store.root) & stat.S_ISGID
    with umask(mask):
        store.create("releases/reviews/license/x.json", b"{}")
        store.replace("releases/channels/staging.json", b"{}", None)
    others = 0o444 & ~mask
    assert mode(store.root / "releases/reviews/license/x.json") == 0o440 | others
    assert mode(store.root / "releases/channels/staging.json") == 0o440 | others
    for made in ("releases", "releases/reviews", "releases/reviews/license"):
        assert mode(store.root / made) == stat.S_ISGID | 0o770 | (0o007 & ~mask), made
    lock = store.root / "releases/channels/.staging.json.lock"
    assert mode(lock) & 0o060 == 0o060 and mode(lock) & 0o007 == 0o666 & ~mask & 0o007


def test_bootstrap_gives_an_existing_tree_to_the_group_once_and_leaves_links(reachable,
                                                                             tmp_path):
    store = FileStore(reachable / "store")
    with umask(0o022):
        Releases(store, tmp_path / "scratch").release()
        store.replace("releases/channels/staging.json", b"{}", None)
    sealed = next((store.root / "models").rglob(".k3a"))
    (store.root / "planted").symlink_to("/etc")
    dry = share(store.url, own_group(), dry_run=True)
    assert dry.changed and not mode(store.root) & stat.S_ISGID  # nothing changed
    first = share(store.url, own_group())
    assert sorted(first.changed) == sorted(dry.changed)
    assert first.links == [str(store.root / "planted")]
    assert mode(store.root / "releases") == stat.S_ISGID | 0o775
    assert mode(sealed) == stat.S_ISGID | 0o555  # a sealed revision stays sealed
    assert mode(store.root / "releases/channels/staging.json") == 0o444
    assert share(store.url, own_group()).changed == []


def test_bootstrap_refuses_a_group_that_does_not_exist_or_cannot_reach_the_store(reachable):
    with pytest.raises(ConfigError, match="there is no group 'k3a-no-such-group'"):
        share(f"file://{reachable}/store", "k3a-no-such-group")
    private = reachable / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(ConfigError) as err:
        share(f"file://{private}/store", own_group())
    assert f"{private} is drwx------" in str(err.value) and "chmod o+x" in err.value.hint
    assert not (private / "store").exists()


READERS = (
    ("policy", "show"),
    ("channel", "list"),
)


@pytest.fixture
def released(shared_store, tmp_path):
    """A team's store with the packaged policy recorded, a tuple and an approval request,
    written by this account under umask 077 (the group reads them all the same)."""
    from k3artifacts.policy.approvals import request_approval
    from k3artifacts.policy.record import packaged_document

    with umask(0o077):
        seed_people(shared_store, packaged_document())
        release = Releases(shared_store, tmp_path / "scratch").release()
        request = request_approval(shared_store, action="promote", by=as_acting(ME),
                                   channel="staging", tuple_id=release.id)
    return shared_store, release, request


def test_the_second_account_of_a_team_reads_reviews_and_approves(second_user, released,
                                                                 k3a_env):
    store, release, request = released
    pin_as(second_user, store, k3a_env)  # as a newcomer joins: the root's fingerprint
    for args in READERS:
        k3a_as(second_user, store, *args, env=k3a_env)
    k3a_as(second_user, store, "review", "license", release.id, env=k3a_env)
    k3a_as(second_user, store, "approve", request.id, "--reason", "read it", env=k3a_env)
    decision = next(store.root.glob(f"releases/approvals/{request.id}/decision.json"))
    assert grp.getgrgid(os.stat(decision).st_gid).gr_name == TEAM_GROUP


def test_an_account_outside_the_store_gets_a_named_refusal(second_user, tmp_path, k3a_env):
    """The store is root's, written under umask 077 and never shared: every reader says who
    may not read what, and the next step, with exit 9 (on stdout with --json)."""
    import tempfile

    from k3artifacts.policy.record import packaged_document

    root = Path(tempfile.mkdtemp(prefix="k3a-private-store-"))
    os.chmod(root, 0o755)
    store = FileStore(root / "store")
    try:
        with umask(0o077):
            seed_people(store, packaged_document())
            release = Releases(store, tmp_path / "scratch").release()
        os.chmod(store.root, 0o755)  # the root is reachable; what k3a wrote is not
        for args in [*READERS, ("review", "license", release.id),
                     ("approve", "k3r-000000000000000000000000")]:
            ran = k3a_as(second_user, store, *args, "--json", env=k3a_env, expect=9)
            document = json.loads(ran.stdout)
            assert document["exit_code"] == 9, args
            assert f"{second_user} may not" in document["error"], args
            assert "k3a bootstrap" in document["next"], args
            assert "Traceback" not in ran.stderr and "PermissionError" not in ran.stderr
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_a_path_outside_the_store_this_account_may_not_write_is_refused_by_name(
        second_user, shared_store, reachable, k3a_env, tmp_path):
    """Not the store's: `k3a render --out` into a directory only root may write to. Exit 9
    naming the path, never a traceback."""
    import k3artifacts.cli.tuples  # noqa: F401 - the child cannot read the stdlib under /root
    import k3artifacts.serving.render  # noqa: F401

    release = Releases(shared_store, tmp_path / "scratch").release()
    out = reachable / "deploy"
    ran = k3a_as(second_user, shared_store, "render", release.id, "--target", "eks", "--out",
                 str(out), env=k3a_env, expect=9)
    assert f"may not use {out}" in ran.stderr and "Traceback" not in ran.stderr
