"""A node cache that trusts nothing on its disk: each forged state an attacker with write access
to the hostPath can leave, on a first pull (the revision never finished on this node) and on a
re-pull (a complete copy is here). The forged bytes are never served as verified: the pull
hashes them in this run, fetches the file again, and the copy then matches the store byte for
byte and passes ``k3a verify --expect-digest``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_nodecache import BIG, MiB, check_copy, pull_json

from k3artifacts.nodecache.layout import CacheLayout, Revision
from k3artifacts.stores.file import FileStore
from tests.support.cli import invoke
from tests.support.releases import Releases
from tests.support.waiting import wait_until

FORGED = bytes(len(BIG))  # same size as the real file: only its bytes tell


@pytest.fixture
def file_releases(tmp_path: Path) -> Releases:
    return Releases(FileStore(tmp_path / "store"), tmp_path / "scratch")


def rev_of(release) -> Revision:
    return Revision(release.binding.weights.repo_id, release.binding.weights.commit)


def record_of(store, release, path: str):
    w = release.binding.weights
    return store.read_manifest(w.repo_id, w.commit).file(path)


def stat_of(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def writable(*dirs: Path) -> None:
    for d in dirs:
        d.chmod(0o755)


def edit_in_place(path: Path) -> None:
    """Flip one byte in place (same inode, same size) and put the old mtime back."""
    before = path.stat()
    path.chmod(0o644)
    with open(path, "r+b") as fh:
        fh.seek(MiB + 3)
        byte = fh.read(1)[0]
        fh.seek(MiB + 3)
        fh.write(bytes([byte ^ 0xFF]))
    path.chmod(0o444)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def swap(path: Path) -> None:
    """Replace the file by forged bytes of the same size, with the old mtime."""
    before = path.stat()
    tmp = path.with_name(".swap")
    tmp.write_bytes(FORGED)
    os.utime(tmp, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(tmp, path)


def served_as_the_store_has_it(store, release, root: Path, out: dict) -> None:
    assert not out["already_present"]
    assert out["bytes_fetched"] >= len(BIG), out  # big.bin crossed the network again
    final = check_copy(root, store, release)
    assert (final / "big.bin").read_bytes() == BIG


def log_naming_big_bin(store, release, partial: Path) -> None:
    """A ``verified.jsonl`` line (what an older k3a kept a file by) naming big.bin as it is."""
    record = record_of(store, release, "big.bin")
    (partial / ".k3a").mkdir(exist_ok=True)
    (partial / ".k3a" / "verified.jsonl").write_text(json.dumps(
        {"path": "big.bin", "size": record.size, "xxh3_128": record.xxh3_128,
         "stat": stat_of(partial / "big.bin")}) + "\n")


def partial_of(file_releases, tmp_path):
    """A release and the partial directory of a pull of it that never finished."""
    release = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    partial = CacheLayout(root).partial_dir(rev_of(release))
    partial.mkdir(parents=True)
    return release, root, partial


def complete_copy(file_releases, tmp_path):
    release = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    pull_json(file_releases.store.url, release.id, root)
    final = CacheLayout(root).final_dir(rev_of(release))
    return release, root, final


def test_a_re_pull_of_an_unchanged_revision_re_hashes_every_byte(file_releases, tmp_path):
    release, root, _ = complete_copy(file_releases, tmp_path)
    out = pull_json(file_releases.store.url, release.id, root)
    assert out["already_present"] and out["bytes_fetched"] == 0
    assert out["bytes_rehashed"] == out["bytes"] and out["files_kept"] == out["files"]
    text = invoke("pull", release.id, "--store", file_releases.store.url, "--to",
                  str(root)).stdout
    assert "already here" in text and "re-hashed" in text


# --- a cached file edited in place with its mtime restored --------------------------------

def test_re_pull_an_edited_file_with_its_mtime_restored_is_fetched_again(
        file_releases, tmp_path):
    release, root, final = complete_copy(file_releases, tmp_path)
    edit_in_place(final / "big.bin")
    ran = invoke("pull", release.id, "--store", file_releases.store.url, "--to",
                 str(root))
    assert "already here" not in ran.stdout and "pulled " in ran.stdout
    assert "big.bin: xxh3-128 differs from the manifest" in ran.stderr
    final = check_copy(root, file_releases.store, release)
    assert (final / "big.bin").read_bytes() == BIG


def test_first_pull_an_edited_file_left_by_an_interrupted_pull_is_fetched_again(
        file_releases, tmp_path):
    release, root, partial = partial_of(file_releases, tmp_path)
    (partial / "big.bin").write_bytes(BIG)
    edit_in_place(partial / "big.bin")
    out = pull_json(file_releases.store.url, release.id, root)
    served_as_the_store_has_it(file_releases.store, release, root, out)


# --- a swapped file with its stats rewritten in verified.json -----------------------------

def test_re_pull_a_swapped_file_with_its_stats_rewritten_in_verified_json_is_fetched_again(
        file_releases, tmp_path):
    release, root, final = complete_copy(file_releases, tmp_path)
    writable(final, final / ".k3a")
    swap(final / "big.bin")
    marker = final / ".k3a" / "verified.json"
    forged = json.loads(marker.read_text())
    # What an older k3a trusted: each file's size, mtime and inode as verified.
    forged["stats"] = {"big.bin": stat_of(final / "big.bin")}
    marker.chmod(0o644)
    marker.write_text(json.dumps(forged))
    out = pull_json(file_releases.store.url, release.id, root)
    assert out["files_kept"] == out["files"] - 1 and out["bytes_fetched"] == len(BIG)
    served_as_the_store_has_it(file_releases.store, release, root, out)
    assert "stats" not in json.loads(marker.read_text())
    assert pull_json(file_releases.store.url, release.id, root)["already_present"]


def test_first_pull_a_swapped_file_with_a_stat_naming_it_is_fetched_again(
        file_releases, tmp_path):
    release, root, partial = partial_of(file_releases, tmp_path)
    (partial / "big.bin").write_bytes(BIG)
    swap(partial / "big.bin")
    log_naming_big_bin(file_releases.store, release, partial)
    out = pull_json(file_releases.store.url, release.id, root)
    served_as_the_store_has_it(file_releases.store, release, root, out)


# --- a planted partial directory with a forged file and a verified.jsonl line naming it ---

def plant_partial(store, release, root: Path) -> Path:
    partial = CacheLayout(root).partial_dir(rev_of(release))
    partial.mkdir(parents=True)
    (partial / "big.bin").write_bytes(FORGED)
    log_naming_big_bin(store, release, partial)
    return partial


def test_first_pull_a_planted_partial_with_a_forged_file_and_its_log_line_is_not_sealed(
        file_releases, tmp_path):
    release = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    partial = plant_partial(file_releases.store, release, root)
    ran = invoke("pull", release.id, "--store", file_releases.store.url, "--to",
                 str(root), "--json")
    assert f"{partial / 'big.bin'}: xxh3-128 differs from the manifest; fetching it again" in ran.stderr
    served_as_the_store_has_it(file_releases.store, release, root, json.loads(ran.stdout))
    final = CacheLayout(root).final_dir(rev_of(release))
    assert sorted(p.name for p in (final / ".k3a").iterdir()) == ["manifest.json",
                                                                   "verified.json"]


# --- a planted decoy revision of another repo holding a forged file -----------------------

def plant_decoy(store, release, root: Path) -> Path:
    """A complete-looking revision of another repo whose manifest lists big.bin with the real
    file's sha256, size and xxh3-128, and whose big.bin holds forged bytes."""
    w = release.binding.weights
    decoy = root / "models" / "evil" / "decoy" / ("d" * 40)
    (decoy / ".k3a").mkdir(parents=True)
    (decoy / "big.bin").write_bytes(FORGED)
    (decoy / ".k3a" / "manifest.json").write_bytes(
        store.published_manifest_bytes(w.repo_id, w.commit, hint=""))
    (decoy / ".k3a" / "verified.json").write_text(json.dumps(
        {"repo_id": "evil/decoy", "commit": "d" * 40, "manifest_digest": w.manifest_digest,
         "algorithms": ["xxh3-128"], "files": 1, "bytes": len(FORGED),
         "stats": {"big.bin": stat_of(decoy / "big.bin")}}))
    assert CacheLayout(root).manifest(Revision("evil/decoy", "d" * 40)) is not None
    return decoy


def test_first_pull_a_decoy_revision_holding_a_forged_file_is_not_linked_in(
        file_releases, tmp_path):
    release = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    decoy = plant_decoy(file_releases.store, release, root)
    ran = invoke("pull", release.id, "--store", file_releases.store.url, "--to",
                 str(root), "--json")
    result = json.loads(ran.stdout)
    assert result["files_linked"] == 0 and result["bytes_reused"] == 0
    assert "big.bin in cached revision evil/decoy@" in ran.stderr and "not reused" in ran.stderr
    assert "reused 1 file" not in ran.stderr
    served_as_the_store_has_it(file_releases.store, release, root, result)
    final = CacheLayout(root).final_dir(rev_of(release))
    assert (final / "big.bin").stat().st_ino != (decoy / "big.bin").stat().st_ino


@pytest.mark.parametrize("plant", ["partial", "decoy"])
def test_re_pull_of_a_copy_missing_a_file_uses_no_planted_partial_or_decoy(
        file_releases, tmp_path, plant):
    release, root, final = complete_copy(file_releases, tmp_path)
    writable(final)
    (final / "big.bin").unlink()
    {"partial": plant_partial, "decoy": plant_decoy}[plant](file_releases.store, release, root)
    out = pull_json(file_releases.store.url, release.id, root)
    assert out["files_linked"] == 0
    served_as_the_store_has_it(file_releases.store, release, root, out)


# --- parts of a file left on disk: a record is a saved transfer, never a hash --------------

def test_forged_parts_with_a_record_claiming_them_fetch_the_whole_file_again(
        file_releases, tmp_path):
    release, root, partial = partial_of(file_releases, tmp_path)
    (partial / ".big.bin.part").write_bytes(FORGED)
    record = record_of(file_releases.store, release, "big.bin")
    parts = -(-len(BIG) // MiB)
    (partial / ".big.bin.part.json").write_text(json.dumps(
        {"size": record.size, "xxh3_128": record.xxh3_128, "part_size": MiB,
         "done": list(range(parts))}))
    ran = invoke("pull", release.id, "--store", file_releases.store.url, "--to",
                 str(root), "--part-size", "1MiB", "--json")
    assert "big.bin: the parts an earlier run left on disk do not verify" in ran.stderr
    result = json.loads(ran.stdout)
    assert result["bytes_fetched"] >= len(BIG)
    served_as_the_store_has_it(file_releases.store, release, root, result)


@pytest.mark.parametrize("record", [{"part_size": 0, "done": [0]},
                                    {"part_size": MiB, "done": [-1, 999]}])
def test_a_record_whose_parts_cannot_cut_the_file_is_ignored(file_releases, tmp_path, record):
    release, root, partial = partial_of(file_releases, tmp_path)
    (partial / ".big.bin.part").write_bytes(FORGED)
    want = record_of(file_releases.store, release, "big.bin")
    (partial / ".big.bin.part.json").write_text(json.dumps(
        {"size": want.size, "xxh3_128": want.xxh3_128, **record}))
    out = pull_json(file_releases.store.url, release.id, root)
    served_as_the_store_has_it(file_releases.store, release, root, out)


# --- refused by name where fetching again would pull a served copy from under a server -----

def test_a_forged_copy_under_a_running_server_is_exit_4_and_left_for_the_operator(
        file_releases, tmp_path, k3a_cmd, k3a_env):
    from k3artifacts.nodecache import locks

    release, root, final = complete_copy(file_releases, tmp_path)
    rev = rev_of(release)
    layout = CacheLayout(root)
    edit_in_place(final / "big.bin")
    forged = (final / "big.bin").read_bytes()
    server = subprocess.Popen(
        [*k3a_cmd, "cache", "lease", str(rev), "--root", str(root), "--", "sleep", "60"],
        env=k3a_env)
    try:
        wait_until(lambda: locks.is_leased(layout, rev), "the lease", timeout=60)
        err = invoke("pull", release.id, "--store", file_releases.store.url, "--to",
                     str(root), expect=4).stderr
        assert "big.bin: xxh3-128 differs from the manifest" in err
        assert "next: a server leases it: stop the server" in err
        assert (final / "big.bin").read_bytes() == forged  # not pulled from under it
    finally:
        server.kill()
        server.wait(10)
    served_as_the_store_has_it(file_releases.store, release, root,
                               pull_json(file_releases.store.url, release.id, root))


def test_a_copy_with_extra_metadata_is_sealed_again_without_fetching(
        file_releases, tmp_path):
    release, root, final = complete_copy(file_releases, tmp_path)
    writable(final, final / ".k3a")
    (final / ".k3a" / "verified.jsonl").write_text("{}\n")
    out = pull_json(file_releases.store.url, release.id, root)
    assert not out["already_present"] and out["bytes_fetched"] == 0
    assert out["files_kept"] == out["files"]
    assert sorted(p.name for p in (final / ".k3a").iterdir()) == ["manifest.json",
                                                                   "verified.json"]
    assert pull_json(file_releases.store.url, release.id, root)["already_present"]
