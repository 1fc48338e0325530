"""Hashing many files at once (k3artifacts.revisions.parallel), in threads and in hashing
processes: the same digests as hashlib and xxhash, largest files first, and a file that cannot
be read (missing, shrunk while read, not a regular file) is that file's named problem, never a
hang, a crash of the run, or a pass."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import xxhash

from k3artifacts.revisions.parallel import PROGRESS_STEP, FileToHash, hash_files

SIZES = {"empty": 0, "small": 1, "odd": 3 * (1 << 20) + 17, "large": 9 * (1 << 20) + 5}


def files_in(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, size in SIZES.items():
        out[name] = tmp_path / name
        out[name].write_bytes(os.urandom(size))
    return out


def to_hash(paths: dict[str, Path]) -> list[FileToHash]:
    return [FileToHash(name, SIZES.get(name, 0),
                       lambda p=path: os.open(p, os.O_RDONLY | os.O_CLOEXEC))
            for name, path in paths.items()]


@pytest.mark.parametrize("processes", [False, True])
@pytest.mark.parametrize("algorithm", ["sha256", "xxh3-128"])
def test_every_file_hashes_as_hashlib_and_xxhash_say(tmp_path, processes, algorithm):
    paths = files_in(tmp_path)
    paths["gone"] = tmp_path / "gone"
    seen = []
    results = hash_files(to_hash(paths), algorithm, workers=3, processes=processes,
                         on_bytes=seen.append)
    reference = hashlib.sha256 if algorithm == "sha256" else xxhash.xxh3_128
    for name, size in SIZES.items():
        data = paths[name].read_bytes()
        assert results[name].digest == reference(data).hexdigest(), name
        assert results[name].size == size and results[name].error is None
    assert results["gone"].error == "missing" and results["gone"].digest is None
    assert sum(seen) == sum(SIZES.values())


def test_the_largest_files_go_first(tmp_path):
    order = []
    hash_files(to_hash(files_in(tmp_path)), "xxh3-128", workers=1,
               on_hashed=lambda r: order.append(r.key))
    assert order == sorted(SIZES, key=SIZES.get, reverse=True)


def test_a_file_that_shrinks_while_a_process_hashes_it_is_its_own_error(tmp_path):
    """The file is reported (the hashing process died of SIGBUS reading a mapped page past the
    new end, or found the next window past it); the other files still hash."""
    paths = files_in(tmp_path)
    victim = tmp_path / "victim"
    with open(victim, "wb") as fh:
        fh.truncate(8 * PROGRESS_STEP)  # sparse: fast to read, long enough to catch mid-way
    files = [FileToHash("victim", 8 * PROGRESS_STEP, lambda: os.open(victim, os.O_RDONLY)),
             *to_hash(paths)]

    def shrink(nbytes: int) -> None:
        if victim.stat().st_size:
            os.truncate(victim, 0)

    results = hash_files(files, "sha256", workers=1, processes=True, on_bytes=shrink)
    assert results["victim"].digest is None
    # Past the end mid-window: SIGBUS kills the process; at a window's start: mmap refuses.
    assert "the file shrank while it was read" in results["victim"].error
    data = paths["large"].read_bytes()
    assert results["large"].digest == hashlib.sha256(data).hexdigest()


def test_a_fifo_planted_in_a_revision_directory_is_named_not_waited_on(tmp_path):
    from click.testing import CliRunner

    from k3artifacts.cli import cli
    from k3artifacts.stores.file import FileStore
    from tests.support.releases import Releases

    store = FileStore(tmp_path / "store")
    manifest = Releases(store, tmp_path / "scratch").publish(extra={"big.bin": b"x" * 4096})
    revision = store.root / "models" / manifest.repo_id / manifest.commit
    big = revision / "big.bin"
    revision.chmod(0o755)
    big.unlink()
    os.mkfifo(big)
    result = CliRunner().invoke(cli, ["verify", str(revision), "--full"])
    assert result.exit_code == 4, result.output
    assert "big.bin: unreadable" in result.stderr and "is not a regular file" in result.stderr
