"""Hashing many files at once (k3artifacts.revisions.parallel), in threads and in hashing
processes: the same digests as hashlib and xxhash, largest files first, and a file that cannot
be read (missing, shrunk while read, not a regular file) is that file's named problem, never a
hang, a crash of the run, or a pass."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

from k3artifacts.revisions.parallel import (
    MAPPED_MIN_BYTES,
    PROCESS_MIN_BYTES,
    PROGRESS_STEP,
    THREADS_ENOUGH,
    FileToHash,
    hash_files,
    in_processes,
)

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


@pytest.mark.parametrize("processes", [False, True])
def test_a_file_that_shrinks_while_it_is_hashed_is_its_own_error(tmp_path, processes):
    """The file is reported as changed while it was read (a thread reads a short count; a
    hashing process dies of SIGBUS reading a mapped page past the new end, or finds the next
    window past it); the other files still hash."""
    paths = files_in(tmp_path)
    victim = tmp_path / "victim"
    with open(victim, "wb") as fh:
        fh.truncate(8 * PROGRESS_STEP)  # sparse: fast to read, long enough to catch mid-way
    files = [FileToHash("victim", 8 * PROGRESS_STEP, lambda: os.open(victim, os.O_RDONLY)),
             *to_hash(paths)]

    def shrink(nbytes: int) -> None:
        if victim.stat().st_size:
            os.truncate(victim, 0)

    results = hash_files(files, "sha256", workers=1, processes=processes, on_bytes=shrink)
    assert results["victim"].digest is None
    assert results["victim"].error.startswith("changed while it was read: ")
    assert "find what can write there and stop it" in results["victim"].error
    data = paths["large"].read_bytes()
    assert results["large"].digest == hashlib.sha256(data).hexdigest()


def test_beyond_eight_workers_every_algorithm_hashes_in_processes():
    for algorithm, least in PROCESS_MIN_BYTES.items():
        assert in_processes(algorithm, THREADS_ENOUGH + 1, least)
        assert not in_processes(algorithm, THREADS_ENOUGH + 1, least - 1)
        assert not in_processes(algorithm, 16, least - 1)
    assert not in_processes("xxh3-128", THREADS_ENOUGH, 1 << 40)


def test_sha256_maps_in_processes_where_each_worker_has_enough_to_hash():
    assert not in_processes("sha256", 2, 2 * MAPPED_MIN_BYTES - 1)
    assert in_processes("sha256", 2, 2 * MAPPED_MIN_BYTES)
    assert not in_processes("xxh3-128", 2, 1 << 40)


@pytest.mark.parametrize("hash_in", ["threads", "processes"])
def test_k3a_verify_in_hashing_processes_passes_a_revision_and_names_a_flipped_byte(
        tmp_path, k3a_env, hash_in):
    """The same verdicts wherever `k3a verify` hashes: the published revision passes (every
    digest as the manifest's, xxh3-128 and sha256), and a byte flipped in a shard fails the
    check naming that shard and both digests."""
    from k3artifacts.stores.file import FileStore
    from tests.support.cli import run_process
    from tests.support.releases import Releases

    store = FileStore(tmp_path / "store")
    manifest = Releases(store, tmp_path / "scratch").publish(shards=3)
    revision = store.root / "models" / manifest.repo_id / manifest.commit
    env = {**k3a_env, "K3A_HASH_IN": hash_in}
    for full in ([], ["--full"]):
        run_process("verify", str(revision), "--workers", "3", *full, env=env)
    shard = next(r for r in manifest.files if r.path.endswith(".safetensors"))
    path = revision / shard.path
    revision.chmod(0o755)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    for full, algorithm, want in (([], "xxh3-128", shard.xxh3_128),
                                  (["--full"], "sha256", shard.sha256)):
        failed = run_process("verify", str(revision), "--workers", "3", *full, env=env,
                             expect=4)
        assert f"{shard.path}: {algorithm} " in failed.stderr, failed.stderr
        assert f"manifest says {want}" in failed.stderr
        assert "1 of " in failed.stderr and "Traceback" not in failed.stderr


def test_a_fifo_planted_in_a_revision_directory_is_named_not_waited_on(tmp_path):
    from k3artifacts.stores.file import FileStore
    from tests.support.cli import invoke
    from tests.support.releases import Releases

    store = FileStore(tmp_path / "store")
    manifest = Releases(store, tmp_path / "scratch").publish(extra={"big.bin": b"x" * 4096})
    revision = store.root / "models" / manifest.repo_id / manifest.commit
    big = revision / "big.bin"
    revision.chmod(0o755)
    big.unlink()
    os.mkfifo(big)
    result = invoke("verify", str(revision), "--full", expect=4)
    assert "big.bin: unreadable" in result.stderr and "is not a regular file" in result.stderr


#: Large enough that a truncation seen as soon as the file is open lands before its last byte
#: is hashed; sparse, so it costs no disk.
VICTIM_SIZE = 512 << 20


@pytest.fixture(scope="module")
def sparse_digests() -> tuple[str, str]:
    sha, xxh = hashlib.sha256(), xxhash.xxh3_128()
    zeros = bytes(8 << 20)
    for _ in range(VICTIM_SIZE // len(zeros)):
        sha.update(zeros)
        xxh.update(zeros)
    return sha.hexdigest(), xxh.hexdigest()


def _revision_with_victim(tmp_path: Path, digests: tuple[str, str]) -> Path:
    """A published revision directory whose manifest lists ``big.bin``, VICTIM_SIZE zeros."""
    from k3artifacts.revisions.manifest import FileRecord, ShardManifest
    from k3artifacts.stores.file import FileStore
    from tests.support.releases import Releases

    store = FileStore(tmp_path / "store")
    manifest = Releases(store, tmp_path / "scratch").publish(shards=0, extra={"big.bin": b"\0"})
    revision = store.root / "models" / manifest.repo_id / manifest.commit
    files = [r for r in manifest.files if r.path != "big.bin"]
    files.append(FileRecord(path="big.bin", size=VICTIM_SIZE, kind="other", sha256=digests[0],
                            xxh3_128=digests[1]))
    grown = manifest.model_copy(update={"files": files, "total_bytes": manifest.total_bytes
                                        - 1 + VICTIM_SIZE})
    for path in (revision, revision / ".k3a", revision / ".k3a" / "manifest.json",
                 revision / "big.bin"):
        path.chmod(0o755)  # writable: whoever truncates the file can write there
    (revision / ".k3a" / "manifest.json").write_bytes(ShardManifest.canonical(grown))
    return revision


def _cpu_ticks(pid: int) -> int:
    """User and system CPU time of ``pid`` so far, in clock ticks (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def _children(pid: int) -> list[int]:
    """The processes ``pid``'s threads started (its hashing processes)."""
    return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()]


def _reading(pid: int, victim: Path, mapped: bool) -> bool:
    """Whether ``pid`` holds ``victim`` open and, where a hashing process reads it
    (``mapped``), one of its children has mapped it."""
    if str(victim) not in [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]:
        return False
    return not mapped or any(str(victim) in Path(f"/proc/{child}/maps").read_text()
                             for child in _children(pid))


def _truncate_mid_read(proc: subprocess.Popen, victim: Path, mapped: bool = False) -> bool:
    """Truncate ``victim`` to nothing once ``proc`` reads it (:func:`_reading`) and it and
    its hashing processes have spent two clock ticks of CPU since (hashing, however they
    read: a mapping or a read); False if ``proc`` ended first."""
    opened_at = None

    def ticks() -> int:
        return sum(map(_cpu_ticks, [proc.pid, *_children(proc.pid)]))

    while proc.poll() is None:
        try:
            if opened_at is None:
                if _reading(proc.pid, victim, mapped):
                    opened_at = ticks()
            elif ticks() - opened_at >= 2:
                os.truncate(victim, 0)
                return True
        except (FileNotFoundError, ProcessLookupError):
            continue  # a descriptor closed under the listing, or a process just ended
        os.sched_yield()
    return False


@pytest.mark.parametrize("hash_in", ["threads", "processes"])
@pytest.mark.parametrize("full", [False, True], ids=["xxh3-128", "sha256"])
def test_a_file_truncated_while_k3a_verify_hashes_it_is_a_named_refusal(
        tmp_path, k3a_env, sparse_digests, full, hash_in):
    """Whoever can write where a revision lies (a pod sharing the node cache's hostPath) cuts
    a file while `k3a verify` reads it, in its threads or in the hashing processes that map
    it: the file is named as changed while it was read (exit 4), never a SIGBUS that kills
    the check. Retried until the cut lands mid-hash (after the file's first bytes were read,
    before its last)."""
    revision = _revision_with_victim(tmp_path, sparse_digests)
    victim = revision / "big.bin"
    command = [sys.executable, "-m", "k3artifacts", "verify", str(revision), "-q",
               *(["--full"] if full else [])]
    env = {**k3a_env, "K3A_HASH_IN": hash_in}
    # A thread reads short and says where the file ended; a hashing process finds the next
    # window past the end, or dies of SIGBUS on a page past it.
    said = "it ended at byte " if hash_in == "threads" else "changed while it was read: it "
    for _ in range(20):
        os.truncate(victim, VICTIM_SIZE)  # zeros again: the manifest's bytes
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        cut = _truncate_mid_read(proc, victim, mapped=hash_in == "processes")
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode != -signal.SIGBUS, "k3a verify was killed by SIGBUS"
        if cut and said in stderr:
            break
    else:
        pytest.fail("the truncation never landed while the file was hashed")
    assert proc.returncode == 4, stderr
    assert "1 of 3 file(s) do not match the manifest" in stderr
    assert "find what can write there and stop it, then run again" in stderr
    assert "Traceback" not in stderr
    if hash_in == "processes":
        assert "big.bin: changed while it was read: it shrank under the hashing process, " \
            "which died of SIGBUS" in stderr or "big.bin: changed while it was read: it " \
            "ended before byte " in stderr, stderr
        return
    ended = int(stderr.split("it ended at byte ")[1].split()[0].replace(",", ""))
    assert 0 < ended < VICTIM_SIZE  # mid-hash: neither before the first byte nor after the last
    assert f"big.bin: changed while it was read: it ended at byte {ended:,}, where it had " \
           f"reached byte {VICTIM_SIZE:,}" in stderr
