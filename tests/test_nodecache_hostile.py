"""The node cache as an attacker (or a full disk) leaves it: planted links, no
space. Each case is refused with a named error and an exit code, and changes nothing outside
the cache root."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest
from test_nodecache import BIG, MiB, check_copy, paused_pull, pull_json

from k3artifacts.nodecache.layout import CacheLayout, Revision
from k3artifacts.stores.file import FileStore
from tests.support.cli import Ran, invoke
from tests.support.releases import Releases
from tests.support.waiting import wait_until

SECRET = b"bytes a pull must never touch\n"


@pytest.fixture
def file_releases(tmp_path: Path) -> Releases:
    return Releases(FileStore(tmp_path / "store"), tmp_path / "scratch")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file and a directory outside the cache root, as a link's targets."""
    victim = tmp_path / "outside"
    victim.mkdir()
    (victim / "secret").write_bytes(SECRET)
    (victim / "secret").chmod(0o640)
    return victim


def untouched(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["secret"]
    assert (victim / "secret").read_bytes() == SECRET
    assert stat.S_IMODE((victim / "secret").stat().st_mode) == 0o640


def rev_of(release) -> Revision:
    return Revision(release.binding.weights.repo_id, release.binding.weights.commit)


def pull(store, release, root: Path, *extra: str, expect: int = 0) -> Ran:
    return invoke("pull", release.id, "--store", store.url, "--to", str(root),
                  "--part-size", "1MiB", "--concurrency", "2", *extra, expect=expect)


def test_a_link_at_the_partial_directory_is_refused_and_nothing_lands_outside(
        file_releases, tmp_path, outside):
    release = file_releases.release(extra={"big.bin": BIG})
    layout = CacheLayout(tmp_path / "cache")
    partial = layout.partial_dir(rev_of(release))
    partial.parent.mkdir(parents=True)
    partial.symlink_to(outside)
    ran = pull(file_releases.store, release, layout.root, expect=9)
    assert f"{partial} is a symbolic link" in ran.stderr and "next:" in ran.stderr
    untouched(outside)
    assert partial.is_symlink() and not os.path.lexists(layout.final_dir(rev_of(release)))


def test_a_link_at_a_part_file_is_refused_and_its_target_keeps_bytes_and_mode(
        file_releases, tmp_path, outside):
    release = file_releases.release(extra={"big.bin": BIG})
    layout = CacheLayout(tmp_path / "cache")
    partial = layout.partial_dir(rev_of(release))
    partial.mkdir(parents=True)
    (partial / ".big.bin.part").symlink_to(outside / "secret")
    ran = pull(file_releases.store, release, layout.root, expect=9)
    assert f"{partial / '.big.bin.part'} is a symbolic link" in ran.stderr
    untouched(outside)
    assert not os.path.lexists(layout.final_dir(rev_of(release)))


@pytest.mark.parametrize("planted", ["final", "org"])
def test_a_link_at_the_final_directory_or_above_is_refused(
        file_releases, tmp_path, outside, planted):
    release = file_releases.release(extra={"big.bin": BIG})
    layout = CacheLayout(tmp_path / "cache")
    final = layout.final_dir(rev_of(release))
    at = final if planted == "final" else final.parent.parent
    at.parent.mkdir(parents=True)
    at.symlink_to(outside)
    ran = pull(file_releases.store, release, layout.root, expect=9)
    assert f"{at} is a symbolic link" in ran.stderr
    untouched(outside)
    err = invoke("cache", "ls", "--root", str(layout.root), expect=9).stderr
    assert f"{at} is a symbolic link" in err


def test_a_link_planted_inside_a_finished_revision_is_refused_on_re_pull(
        file_releases, tmp_path, outside):
    release = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    pull_json(file_releases.store.url, release.id, root)
    final = CacheLayout(root).final_dir(rev_of(release))
    final.chmod(0o755)
    (final / "big.bin").unlink()
    (final / "big.bin").symlink_to(outside / "secret")
    ran = pull(file_releases.store, release, root, expect=9)
    assert f"{final / 'big.bin'} is a symbolic link" in ran.stderr
    untouched(outside)


def test_a_finished_revision_is_read_only_whatever_the_umask(file_releases, tmp_path):
    release = file_releases.release(extra={"big.bin": BIG, "sub/dir/small.txt": b"x"})
    root = tmp_path / "cache"
    old = os.umask(0)
    try:
        pull_json(file_releases.store.url, release.id, root)
    finally:
        os.umask(old)
    final = CacheLayout(root).final_dir(rev_of(release))
    modes = {p.relative_to(final).as_posix(): stat.S_IMODE(p.lstat().st_mode)
             for p in [final, *final.rglob("*")]}
    assert modes["."] == 0o555 and modes[".k3a"] == 0o555 and modes["sub/dir"] == 0o555
    assert modes["big.bin"] == modes[".k3a/verified.json"] == modes[".k3a/manifest.json"] \
        == 0o444
    assert set(modes.values()) == {0o555, 0o444}
    # Read-only is no obstacle to eviction.
    invoke("cache", "rm", str(rev_of(release)), "--root", str(root))
    assert not final.exists()


# --- a full disk: a small tmpfs mounted by the test --------------------------------------

@contextlib.contextmanager
def small_fs(where: Path, size: str):
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_too_little_space_is_refused_before_the_first_byte(file_releases, tmp_path):
    release = file_releases.release(extra={"big.bin": BIG})
    with small_fs(tmp_path / "small", "4m") as root:
        ran = pull(file_releases.store, release, root, expect=8)
        assert "need " in ran.stderr and ", have " in ran.stderr and "on tmpfs mounted at " in ran.stderr
        assert "nothing was fetched" in ran.stderr and "k3a cache gc" in ran.stderr
        assert not list(root.rglob("*.part"))


def test_a_disk_that_fills_during_the_pull_is_exit_8_and_the_partial_is_listed_and_freed(
        file_releases, tmp_path, k3a_cmd, k3a_env):
    release = file_releases.release(extra={"big.bin": BIG})
    rev = rev_of(release)
    resume = tmp_path / "resume"
    with small_fs(tmp_path / "small", "8m") as root:
        env = dict(k3a_env, K3A_FAULT_PAUSE="pull-planned:120", K3A_FAULT_RESUME=str(resume))
        err_path = tmp_path / "stderr"
        with open(err_path, "wb") as errf:
            proc = subprocess.Popen(
                [*k3a_cmd, "pull", release.id, "--store", file_releases.store.url, "--to",
                 str(root), "--part-size", "1MiB", "-q"],
                env=env, stderr=errf, stdout=subprocess.DEVNULL)
        try:
            wait_until(lambda: b"paused at pull-planned" in err_path.read_bytes()
                       or proc.poll() is not None, "the space check", timeout=60)
            # Someone else fills the disk between our check and our writes.
            filler = root / f"filler-{uuid.uuid4().hex}"
            with open(filler, "wb") as fh, contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            resume.touch()
            assert proc.wait(60) == 8, err_path.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        err = err_path.read_text()
        assert "the node cache's disk is full (tmpfs mounted at" in err, err
        assert ".part: No space left on device (preallocating" in err
        assert "k3a cache list" in err and "Traceback" not in err
        listed = invoke("cache", "ls", "--root", str(root), "--json").json
        assert [(c["revision"], c["partial"]) for c in listed] == [
            (str(rev), True)]
        filler.unlink()
        out = pull_json(file_releases.store.url, release.id, root)  # resumes
        assert not out["already_present"]
        check_copy(root, file_releases.store, release)


def test_gc_frees_an_unfinished_pull(file_releases, tmp_path):
    release = file_releases.release(extra={"big.bin": BIG})
    rev = rev_of(release)
    root = tmp_path / "cache"
    partial = CacheLayout(root).partial_dir(rev)
    partial.mkdir(parents=True)
    (partial / ".big.bin.part").write_bytes(BIG[:MiB])
    out = invoke("cache", "ls", "--root", str(root), "--json").stdout
    [entry] = json.loads(out)
    assert entry["partial"] and entry["revision"] == str(rev) and entry["bytes"] >= MiB
    out = invoke("cache", "gc", "--keep", "1", "--root", str(root), "--json").stdout
    assert json.loads(out)["partials"] == [str(rev)]
    assert not partial.exists()


def test_a_hard_link_at_a_part_file_with_a_forged_record_leaves_its_other_file_alone(
        file_releases, tmp_path, outside):
    release = file_releases.release(extra={"big.bin": BIG})
    layout = CacheLayout(tmp_path / "cache")
    partial = layout.partial_dir(rev_of(release))
    partial.mkdir(parents=True)
    secret = outside / "secret"
    padded = tmp_path / "outside2"
    padded.mkdir()
    victim = padded / "victim"
    victim.write_bytes(bytes(len(BIG)))  # the size the record claims
    victim.chmod(0o640)
    os.link(victim, partial / ".big.bin.part")
    w = release.binding.weights
    record = file_releases.store.read_manifest(w.repo_id, w.commit).file("big.bin")
    (partial / ".big.bin.part.json").write_text(json.dumps(
        {"size": record.size, "xxh3_128": record.xxh3_128, "part_size": MiB, "done": [0, 1]}))
    out = pull_json(file_releases.store.url, release.id, layout.root)
    assert out["bytes_resumed"] == out["files_kept"] == 0
    assert victim.read_bytes() == bytes(len(BIG)) and victim.stat().st_nlink == 1
    assert stat.S_IMODE(victim.stat().st_mode) == 0o640
    assert secret.read_bytes() == SECRET
    check_copy(layout.root, file_releases.store, release)


def test_a_planted_tree_too_deep_to_walk_is_refused_not_a_recursion_error(
        file_releases, tmp_path):
    release = file_releases.release()
    layout = CacheLayout(tmp_path / "cache")
    partial = layout.partial_dir(rev_of(release))
    deep = partial.joinpath(*["d"] * 100)
    deep.mkdir(parents=True)
    err = pull(file_releases.store, release, layout.root, expect=9).stderr
    assert "nests deeper than 64 directories" in err and "Traceback" not in err


def test_a_part_file_truncated_before_the_pull_hashes_it_is_exit_4_named(
        file_releases, tmp_path, k3a_cmd, k3a_env):
    """A process of this account sharing the cache's hostPath cuts a part file the pull wrote
    but has not hashed yet: the pull hashes the buffer it wrote, never the file, and its next
    change to the file finds the file's ctime moved: exit 4 naming it, no traceback, and
    nothing reaches the final path."""
    said, root, release = _pull_spoiled_at(file_releases, tmp_path, k3a_cmd, k3a_env, 0,
                                           lambda part: os.truncate(part, 0))
    assert ("big.bin: changed in the node cache after this pull wrote or hashed it, before the "
            "revision was sealed; nothing was put at the final path") in said
    assert "find and stop it, then re-run `k3a pull`" in said and "Traceback" not in said
    assert not CacheLayout(root).final_dir(rev_of(release)).exists()
    assert not (CacheLayout(root).partial_dir(rev_of(release)) / ".big.bin.part").exists()


def test_an_already_hashed_part_rewritten_before_the_seal_is_exit_4_named(
        file_releases, tmp_path, k3a_cmd, k3a_env):
    """The issue's case: bytes of a part the pull had already hashed are rewritten (and the
    mtime put back) while later parts arrive. The hash is fed from the buffers written and
    never reads the file, so the pull used to print "verified" and `k3a verify
    --expect-digest` then exited 4. Now the file's ctime, moved by the rewrite, is found at
    the pull's next change to it: exit 4 naming the file, nothing at the final path."""
    def rewrite(part: Path) -> None:
        before = part.stat()
        with open(part, "r+b") as f:  # part 0: written and hashed before part 1 paused
            f.seek(1000)
            f.write(b"\0" if BIG[1000] else b"\1")
        os.utime(part, ns=(before.st_atime_ns, before.st_mtime_ns))

    said, root, release = _pull_spoiled_at(file_releases, tmp_path, k3a_cmd, k3a_env, 1, rewrite)
    assert ("big.bin: changed in the node cache after this pull wrote or hashed it, before the "
            "revision was sealed; nothing was put at the final path") in said
    assert "find and stop it, then re-run `k3a pull`" in said and "Traceback" not in said
    assert not CacheLayout(root).final_dir(rev_of(release)).exists()


def _pull_spoiled_at(file_releases, tmp_path, k3a_cmd, k3a_env, part_index: int, spoil):
    """A pull of big.bin paused once part ``part_index`` is written, its part file handed to
    ``spoil`` (as another process on the node would touch it), then let go: (its stderr, the
    cache root, the release), once it exited 4."""
    release = file_releases.release(extra={"big.bin": BIG})
    root = tmp_path / "cache"
    resume = tmp_path / "resume"
    env = dict(k3a_env, K3A_FAULT_PAUSE=f"pull-part@big.bin#{part_index}:120",
               K3A_FAULT_RESUME=str(resume))
    err_path = tmp_path / "stderr"
    proc = paused_pull(k3a_cmd, env, file_releases.store.url, release.id, root, err_path)
    try:
        spoil(CacheLayout(root).partial_dir(rev_of(release)) / ".big.bin.part")
        resume.touch()
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    said = err_path.read_text()
    assert proc.returncode == 4, said
    return said, root, release
