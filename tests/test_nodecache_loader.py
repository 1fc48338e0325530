"""`k3a pull --verified-by-loader`, the pull of a node whose server loads with `--load-format
k3a` (which hashes every weights file as it reads it): the weights already on the node are
not re-hashed, files fetched are hashed as they are written, a file the loader refused is
fetched again (and only it), and a rollback to the tuple before the current one, still
resident, transfers nothing. Counts are the pull's own (`--json`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_nodecache import BIG, MiB, check_copy, pull_json

from k3artifacts.nodecache import refusals
from k3artifacts.nodecache.layout import CacheLayout, Revision
from k3artifacts.revisions.manifest import is_weights
from k3artifacts.serving.render.node_cache import KEEP
from k3artifacts.stores.file import FileStore
from tests.support.cli import invoke
from tests.support.releases import Releases

SHARD = "model-00009-of-00009.safetensors"  # the pull reads no header: any bytes do


@pytest.fixture
def file_releases(tmp_path: Path) -> Releases:
    return Releases(FileStore(tmp_path / "store"), tmp_path / "scratch")


def small_bytes(store, release) -> int:
    """Bytes of the files the loader does not hash (config, index, licence...)."""
    w = release.binding.weights
    return sum(r.size for r in store.read_manifest(w.repo_id, w.commit).files
               if not is_weights(r))


def rev_of(release) -> Revision:
    return Revision(release.binding.weights.repo_id, release.binding.weights.commit)


def test_the_weights_on_the_node_are_left_to_the_loader_and_the_rest_is_hashed(
        file_releases, tmp_path):
    release = file_releases.release(extra={SHARD: BIG})
    store, root = file_releases.store, tmp_path / "cache"
    small = small_bytes(store, release)
    first = pull_json(store.url, release.id, root, "--verified-by-loader")
    # What the node lacked: fetched, and hashed once as written.
    assert first["bytes_fetched"] == first["bytes_hashed"] == first["bytes"]
    assert first["bytes_rehashed"] == 0
    again = pull_json(store.url, release.id, root, "--verified-by-loader")
    assert again["already_present"] and again["bytes_fetched"] == 0
    assert again["bytes_hashed"] == again["bytes_rehashed"] == small < len(BIG)
    # A profile without the k3a load format: every byte on the node is re-hashed.
    full = pull_json(store.url, release.id, root)
    assert full["already_present"] and full["bytes_hashed"] == full["bytes"]


def test_a_file_the_loader_refused_is_fetched_again_and_only_it(file_releases, tmp_path):
    release = file_releases.release(extra={SHARD: BIG})
    store, root = file_releases.store, tmp_path / "cache"
    layout = CacheLayout(root)
    digest = release.binding.weights.manifest_digest
    pull_json(store.url, release.id, root, "--verified-by-loader")
    shard = layout.final_dir(rev_of(release)) / SHARD
    with open(shard, "r+b") as fh:  # a flipped bit on the node's disk
        fh.seek(3 * MiB)
        byte = fh.read(1)[0]
        fh.seek(3 * MiB)
        fh.write(bytes([byte ^ 1]))
    # The pull does not read the weights: the loader does, and refuses this one.
    assert pull_json(store.url, release.id, root, "--verified-by-loader")["already_present"]
    where = layout.state / refusals.KIND
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    refusals.record(where, digest, SHARD, "xxh3-128 0123, the signed manifest says 4567")
    out = pull_json(store.url, release.id, root, "--verified-by-loader")
    assert not out["already_present"]
    assert out["files_fetched"] == 1 and out["bytes_fetched"] == len(BIG)
    assert out["bytes_hashed"] == len(BIG) + out["bytes_rehashed"]
    assert out["bytes_rehashed"] == small_bytes(store, release)
    check_copy(root, store, release)
    assert list(where.iterdir()) == []  # repaired: the record is gone


def test_a_weights_file_of_the_wrong_size_is_fetched_again_without_the_loader(
        file_releases, tmp_path):
    release = file_releases.release(extra={SHARD: BIG})
    store, root = file_releases.store, tmp_path / "cache"
    pull_json(store.url, release.id, root, "--verified-by-loader")
    os.truncate(CacheLayout(root).final_dir(rev_of(release)) / SHARD, MiB)
    out = pull_json(store.url, release.id, root, "--verified-by-loader")
    assert out["files_fetched"] == 1 and out["bytes_fetched"] == len(BIG)
    check_copy(root, store, release)


@pytest.mark.s3
def test_a_rollback_to_the_previous_tuple_is_resident_and_transfers_nothing(
        seaweed_store, tmp_path):
    """The render keeps KEEP revisions on a node (`k3a pull --keep`): the one serving, a
    candidate, the one before. Pulling the previous tuple after the newer one finds it whole:
    nothing crosses the network, and with the k3a load format nothing is re-hashed but the
    small files (the loader hashes the weights as it loads them)."""
    releases = Releases(seaweed_store, tmp_path / "scratch")
    previous = releases.release(extra={SHARD: BIG})
    newer = releases.release(extra={SHARD: os.urandom(len(BIG))})
    root = tmp_path / "cache"
    keep = ("--keep", str(KEEP), "--verified-by-loader")
    pull_json(seaweed_store.url, previous.id, root, *keep)
    moved = pull_json(seaweed_store.url, newer.id, root, *keep)
    assert moved["evicted"] == [] and moved["bytes_fetched"] > len(BIG)
    back = pull_json(seaweed_store.url, previous.id, root, *keep)
    assert back["already_present"] and back["evicted"] == []
    assert back["bytes_fetched"] == 0
    assert back["bytes_hashed"] == small_bytes(seaweed_store, previous) < len(BIG)
    listed = invoke("cache", "ls", "--root", str(root), "--json").json
    assert {c["revision"] for c in listed} == {str(rev_of(previous)), str(rev_of(newer))}
