"""Hash many files at once, at the machine's limit: one file per core, each byte read once.

Files are handed out largest first to ``workers`` drivers (one per usable core by default),
so the last file to finish is a small one. Each worker reads its file from the page cache a
buffer (a thread) or a mapped window (a hashing process) at a time (:mod:`.hashworker`):
memory is one of those per worker, whatever the files' sizes, and no byte is read twice.

Where a worker hashes depends on the algorithm, the number of workers and the bytes, as
measured on the 16-core machine (bench/RESULTS.md, issues 35, 36 and 42). Threads of one
process hash with no process to start, and up to :data:`THREADS_ENOUGH` workers they kept up
(8 sha256 threads against 8 processes: 10.7 GB/s each way; 2 of either on the 2-core machine).
Beyond that they do not: 16 threads reading xxh3-128 into their buffers gave half of what 16
hashing processes gave (23.8 against 48.2 GB/s; most likely the GIL, which each 512 KiB
read and hash take back, every 40 microseconds or so of xxh3), and 16 sha256 threads a third
less on one host. So beyond :data:`THREADS_ENOUGH` workers both algorithms run in
hashing processes (:mod:`.hashworker`), which map the file; sha256 also wherever each worker
has :data:`MAPPED_MIN_BYTES` to hash (a thread's copy costs it about 8% more CPU per byte,
xxh3-128 nothing measurable). Below :data:`PROCESS_MIN_BYTES` of an algorithm, processes are
not worth their start (:func:`in_processes`). ``K3A_HASH_IN`` overrides the choice on a
machine where ``python -m bench --only verify`` shows the other side faster. A hashing process
is fed one open descriptor at a time over a socket: the caller opens every file (link-safe
where it must be), a process never resolves a path.

A file that something else truncates while it is hashed (whoever can write where it lies: a
pod sharing the node cache's hostPath) is that file's problem, "changed while it was read",
never the run's: threads read into a buffer (a short read), and a hashing process, which maps
the file, dies of SIGBUS alone and is replaced for the next file.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from k3artifacts import settings
from k3artifacts.revisions.hashworker import ALGORITHMS, CHANGED, ChangedWhileRead, hash_fd

#: Total bytes from which hashing processes are worth their start, by algorithm: a process
#: starts in 0.01-0.03 s on 16 cores, where 16 threads lose 0.02 s a GB of xxh3-128 to them
#: (1/23.8 - 1/48.2 s) and about 0.02 s every 256 MiB of sha256.
PROCESS_MIN_BYTES = {"sha256": 256 << 20, "xxh3-128": 1 << 30}
#: Workers up to which threads keep up with hashing processes (8 did, 16 did not).
THREADS_ENOUGH = 8
#: Bytes per worker from which sha256 goes to hashing processes at any number of workers:
#: reading a mapping spares the copy a thread makes. 2 workers on the 2-core machine, GB of
#: sha256 per CPU-second: 768 MiB each, processes 1.19-1.26 and threads 1.08-1.17; 192 MiB
#: each, processes 1.03-1.08 (their start costs more than the copy) and threads 1.09-1.12.
MAPPED_MIN_BYTES = 512 << 20
#: Said after a file that changed while it was read: what to do about it.
CHANGED_NEXT = ("something other than k3a writes to it: find what can write there and stop "
                "it, then run again")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's cpuset)."""
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class FileToHash:
    #: The caller's name for the file (a manifest path): results are keyed by it.
    key: str
    #: Bytes expected: the larger files are started first.
    size: int
    #: Opens the file read-only and returns the descriptor; may raise ``FileNotFoundError``
    #: or ``OSError`` (reported per file) or a refusal (raised to the caller).
    open: Callable[[], int]


@dataclass(frozen=True)
class Hashed:
    key: str
    #: Bytes read (the file's size when it was opened).
    size: int = 0
    digest: str | None = None
    #: ``missing``, why the file could not be read, or that it changed while it was read;
    #: None when ``digest`` is set.
    error: str | None = None


def _changed(detail: str) -> str:
    return f"{detail}; {CHANGED_NEXT}"


def in_processes(algorithm: str, workers: int, total: int) -> bool:
    """Whether ``workers`` hashing ``total`` bytes with ``algorithm`` run in hashing processes
    (the module's docstring says why)."""
    if total < PROCESS_MIN_BYTES[algorithm]:
        return False
    return workers > THREADS_ENOUGH or (
        algorithm == "sha256" and total >= workers * MAPPED_MIN_BYTES)


def hash_files(files: Iterable[FileToHash], algorithm: str, *, workers: int | None = None,
               processes: bool | None = None, on_bytes: Callable[[int], None] | None = None,
               on_hashed: Callable[[Hashed], None] | None = None) -> dict[str, Hashed]:
    """Every file's digest, ``workers`` at a time (default: one per usable core).
    ``processes``: hash in separate processes (default: ``K3A_HASH_IN``, else
    :func:`in_processes`). ``on_bytes`` sees bytes as they are hashed and ``on_hashed``
    each file once done, from the driving threads."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    queue = collections.deque(sorted(files, key=lambda f: f.size, reverse=True))
    if not queue:
        return {}
    workers = max(1, min(workers or usable_cores(), len(queue)))
    if processes is None:
        chosen = settings.load().hash_in
        processes = in_processes(algorithm, workers, sum(f.size for f in queue)) \
            if chosen is None else chosen == "processes"
    run = _Run(queue, algorithm, on_bytes, on_hashed)
    drivers = [threading.Thread(target=run.drive, args=(processes,), daemon=True,
                                name=f"k3a-hash-{n}") for n in range(workers)]
    for thread in drivers:
        thread.start()
    for thread in drivers:
        thread.join()
    if run.failure is not None:
        raise run.failure
    return run.results


class _Run:
    def __init__(self, queue: collections.deque[FileToHash], algorithm: str,
                 on_bytes: Callable[[int], None] | None,
                 on_hashed: Callable[[Hashed], None] | None):
        self.queue = queue
        self.algorithm = algorithm
        self.on_bytes = on_bytes
        self.on_hashed = on_hashed
        self.lock = threading.Lock()
        self.results: dict[str, Hashed] = {}
        self.failure: BaseException | None = None

    def _next(self) -> FileToHash | None:
        with self.lock:
            if self.failure is not None or not self.queue:
                return None
            return self.queue.popleft()

    def drive(self, processes: bool) -> None:
        worker: _Process | None = None
        try:
            while (item := self._next()) is not None:
                try:
                    fd = item.open()
                except FileNotFoundError:
                    self._done(Hashed(item.key, error="missing"))
                    continue
                except OSError as exc:
                    self._done(Hashed(item.key, error=f"unreadable: {exc}"))
                    continue
                try:
                    if processes:
                        if worker is None:
                            worker = _Process()
                        result = worker.hash(item.key, fd, self.algorithm, self.on_bytes)
                        if result.error is not None and not worker.alive():
                            worker = None  # a new one for the next file
                    else:
                        result = self._in_thread(item.key, fd)
                finally:
                    os.close(fd)
                self._done(result)
        except BaseException as exc:  # noqa: BLE001 - raised by hash_files in the caller
            with self.lock:
                self.failure = self.failure or exc
        finally:
            if worker is not None:
                worker.close()

    def _in_thread(self, key: str, fd: int) -> Hashed:
        try:
            size, digest = hash_fd(fd, self.algorithm, self.on_bytes)
        except ChangedWhileRead as exc:
            return Hashed(key, error=_changed(str(exc)))
        except OSError as exc:
            return Hashed(key, error=f"unreadable: {exc}")
        return Hashed(key, size, digest)

    def _done(self, result: Hashed) -> None:
        with self.lock:
            self.results[result.key] = result
        if self.on_hashed is not None:
            self.on_hashed(result)


#: Bytes a hashing process reports progress in (a message per this many bytes).
PROGRESS_STEP = 64 << 20


class _Process:
    """One hashing process (:mod:`.hashworker`) and the socket that feeds it descriptors."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Its own interpreter, isolated from the environment (-I) and without site (-S):
        # it finds our package and xxhash where this process found them.
        paths = [str(Path(__file__).resolve().parents[2]), *filter(None, sys.path)]
        code = (f"import sys; sys.path[:] = {paths!r}; from k3artifacts.revisions.hashworker "
                f"import serve; serve({theirs.fileno()}, {PROGRESS_STEP})")
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", code], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr)
        finally:
            theirs.close()
        self.sock = ours

    def alive(self) -> bool:
        return self.proc.poll() is None

    def hash(self, key: str, fd: int, algorithm: str,
             on_bytes: Callable[[int], None] | None) -> Hashed:
        try:
            socket.send_fds(self.sock, [algorithm.encode()], [fd])
        except OSError:
            return Hashed(key, error=self._death())
        while True:
            msg = self.sock.recv(512)
            if not msg:
                return Hashed(key, error=self._death())
            kind, body = msg[:1], msg[1:].decode()
            if kind == b"P":
                if on_bytes is not None:
                    on_bytes(int(body))
            elif kind == b"D":
                size, digest = body.split(" ")
                return Hashed(key, int(size), digest)
            elif kind == b"C":
                return Hashed(key, error=_changed(body))
            else:
                return Hashed(key, error=f"unreadable: {body}")

    def _death(self) -> str:
        code = self.proc.wait()
        if code == -signal.SIGBUS:  # a mapped page past the file's new end
            return _changed(f"{CHANGED}: it shrank under the hashing process, which died of "
                            "SIGBUS")
        self.stderr.seek(0)
        said = self.stderr.read().decode(errors="replace").strip().splitlines()
        why = f"signal {-code}" if code < 0 else f"exit {code}"
        return "unreadable: the hashing process died (" + why + \
            (f": {said[-1]}" if said else "") + ")"

    def close(self) -> None:
        self.sock.close()  # the process reads EOF and exits
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()
