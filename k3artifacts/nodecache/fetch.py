"""Many ranged reads in flight, each part written once and hashed from the buffer it was
written from: no byte of a fetched file is read back from the disk.

Each file to fetch is preallocated (``posix_fallocate``) as ``.<name>.part``, created anew
(``O_EXCL``, never through a link, mode 0600) in the pull's partial directory, which only this
account can write (:func:`k3artifacts.nodecache.pull`) and cut into parts. ``Tuning.concurrency``
worker threads take parts in file order; each first takes a part buffer from a bounded pool
(``2 * concurrency`` buffers of ``part_size``), streams its part from the source into it,
writes it to the part file with ``pwrite`` and hands it to the file. Parts finish out of order,
so each file keeps a hash cursor: whichever thread completes the part at the cursor feeds
xxh3-128 from the buffers of it and any later parts already complete, and returns those
buffers to the pool. A worker takes its buffer before it takes a part, so the part at every
cursor always holds one: the pool never starves the cursor.

What was written is what was hashed only if nothing else wrote the file meanwhile. Other
accounts cannot (the directory); this account's other processes can, so every change the pull
makes to a part file (preallocation, each ``pwrite``, the final ``chmod`` and rename) is
bracketed by an ``fstat``: the file's ctime must still be the one the pull's own last change
left (the kernel sets it on every write, chmod or utime, and since the pull looked at it, to
the nanosecond on Linux 6.13+), else the file is deleted and the pull refuses it (exit 4). The
ctime after the rename is the file's identity, held in memory to the seal
(:func:`~k3artifacts.nodecache.onhand.still_as_hashed`).

A flusher thread records which parts are on disk in a sidecar (``.<name>.part.json``) once a
second, each time after an ``fdatasync``, so a killed pull resumes from the last record
without fetching those parts again; workers never wait for it. The record saves a transfer,
never a hash: parts a previous run left are read from the disk and hashed in order with the
rest (the only bytes of a fetched file read back), and a file is renamed to its final name only
when all of its bytes hash in this run to its xxh3-128 (and the store's CRC64NVME, when
recorded). A mismatch in a file with resumed parts (planted, or torn on disk) fetches the whole
file again; a mismatch in bytes all fetched by this run deletes it and names the store's copy.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from k3artifacts import faultpoints
from k3artifacts.errors import ConfigError, NotFound, Unavailable, VerifyMismatch
from k3artifacts.nodecache.layout import PartsRecord
from k3artifacts.nodecache.onhand import Identity, changed_after_hashing
from k3artifacts.nodecache.safefs import FILE_MODE, Dir
from k3artifacts.revisions.hashing import MultiHasher, feed_range
from k3artifacts.revisions.hashworker import ChangedWhileRead
from k3artifacts.revisions.manifest import FileRecord
from k3artifacts.stores.base import RangeReader as Source
from k3artifacts.stores.base import ShortRead

log = logging.getLogger(__name__)

MiB = 1 << 20
#: Bytes each worker receives per read call (then copied into its part buffer).
CHUNK = 1 * MiB
#: Part buffers per worker: parts that finished ahead of their file's hash cursor wait in them.
BUFFERS_PER_WORKER = 2
#: Mode of a part file while it is written: this account's alone.
PART_MODE = 0o600
#: Seconds between sidecar records (each costs an fdatasync per file in flight).
FLUSH_INTERVAL = 1.0


@dataclass(frozen=True)
class Tuning:
    """Defaults measured against SeaweedFS on loopback (bench/RESULTS.md, figure 8): 512 MiB
    in shards of 256 MiB down to 8 MiB, 16 MiB x 16 in flight gave 490-630 MB/s; 8 MiB parts
    ~300, 32-64 MiB ~400-530, 8 or 32 in flight less than 16. On EC2 against S3 more in
    flight pays (S3 serves ~100 MB/s per connection): raise --concurrency there. Memory is
    ``BUFFERS_PER_WORKER * concurrency * part_size`` (512 MiB at the defaults)."""

    part_size: int = 16 * MiB
    concurrency: int = 16
    #: HTTP connections of the S3 client (one per worker unless said otherwise).
    connections: int | None = None
    attempts: int = 4

    def __post_init__(self) -> None:
        if self.part_size < MiB or self.part_size % MiB:
            raise ConfigError(f"part size {self.part_size} must be a whole number of MiB")
        if self.concurrency < 1:
            raise ConfigError("concurrency must be at least 1")

    @property
    def pool_connections(self) -> int:
        return max(self.connections or self.concurrency, 1)


def part_name(name: str) -> str:
    return f".{name}.part"


def sidecar_name(name: str) -> str:
    return f".{name}.part.json"


class FileJob:
    """One file being fetched: its part file, which parts are on disk, the buffers of parts
    not yet hashed, its hash cursor, and the ctime its last change by this pull left.

    Every name is opened in ``parent`` (a directory descriptor) without following links."""

    def __init__(self, record: FileRecord, parent: Dir, name: str, part_size: int,
                 want_crc: str | None, release: Callable[[bytearray], None]):
        self.record = record
        self.parent = parent
        self.name = name
        self.part = part_name(name)
        self.sidecar = sidecar_name(name)
        self.want_crc = want_crc
        self.part_size = part_size
        self.release = release
        self.fd = -1
        self.ctime_ns = 0
        #: The file at its final name as this pull left it (set once it is verified).
        self.identity: Identity | None = None
        done = self._resume(part_size)
        self.nparts = -(-record.size // self.part_size)
        self.on_disk: set[int] = set(done)
        #: Parts written by this run and not hashed yet: the buffers they were written from.
        self.held: dict[int, bytearray] = {}
        self.resumed_bytes = sum(self.length(i) for i in done)
        self.missing = [i for i in range(self.nparts) if i not in self.on_disk]
        self.hasher = MultiHasher(sha256=False, xxh3=True, crc64nvme=want_crc is not None)
        self.cursor = 0
        #: Bytes this run fed to the hash (resumed parts read from the disk included).
        self.hashed = 0
        self.hashing = False
        self.finished = False
        self.lock = threading.Lock()
        #: Held while the part file changes (a write, a record, the finish, a close): each
        #: change is checked and marked as this pull's (:meth:`_change`).
        self.file_lock = threading.Lock()
        self.recorded = len(done)

    def restart(self) -> None:
        """Drop the parts on disk and start the file over: every part fetched again (only
        when no worker holds a part of it: all were on disk and hashed)."""
        with self.file_lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            with self.lock:
                self.on_disk = set()
                self.missing = list(range(self.nparts))
                self.resumed_bytes = 0
                self.recorded = 0
                self.cursor = 0
                self.finished = False
                self.hasher = MultiHasher(sha256=False, xxh3=True,
                                          crc64nvme=self.want_crc is not None)
            self._fresh()

    def _resume(self, part_size: int) -> list[int]:
        """Parts a previous run recorded, if its part file is still the same file."""
        raw = self.parent.read_bytes(self.sidecar)
        try:
            rec = None if raw is None else PartsRecord.model_validate_json(raw)
        except ValueError:
            rec = None
        # The record is as hostile as the rest of the disk: its parts must cut this file.
        if rec is not None and rec.size == self.record.size \
                and rec.xxh3_128 == self.record.xxh3_128 \
                and rec.part_size >= MiB and rec.part_size % MiB == 0:
            try:
                fd = self.parent.open_regular(self.part, os.O_RDWR)
            except FileNotFoundError:
                fd = -1
            if fd >= 0:
                st = os.fstat(fd)
                # Another name for this inode (a planted hard link) could change it behind
                # the record: only a part file this pull alone names, and this account owns,
                # is resumed.
                if st.st_size == rec.size and st.st_nlink == 1 and st.st_uid == os.geteuid():
                    os.fchmod(fd, PART_MODE)
                    self.part_size = rec.part_size  # the parts on disk are cut that way
                    self.fd = fd
                    self._mark()
                    nparts = -(-self.record.size // self.part_size)
                    return sorted({i for i in rec.done if 0 <= i < nparts})
                os.close(fd)
        self._fresh()
        return []

    def _fresh(self) -> None:
        """An empty part file in place of whatever is there, and no record of parts."""
        self.parent.unlink(self.sidecar)
        self.fd = self.parent.create_new(self.part, PART_MODE)
        if self.record.size:
            # One extent up front: no fragmentation from out-of-order writes, and ENOSPC now
            # rather than after most of a shard has crossed the network.
            try:
                os.posix_fallocate(self.fd, 0, self.record.size)
            except OSError as exc:
                os.close(self.fd)
                self.fd = -1
                raise OSError(exc.errno, f"{exc.strerror} (preallocating {self.record.size:,} "
                              "bytes)", str(self.parent.path / self.part)) from None
        self._mark()

    def _mark(self) -> None:
        self.ctime_ns = os.fstat(self.fd).st_ctime_ns

    def _change(self, change: Callable[[], None]) -> None:
        """Make ``change`` to the part file (``file_lock`` held) if the file is still as this
        pull's last change left it, and mark the result as this pull's."""
        st = os.fstat(self.fd)
        if st.st_ctime_ns != self.ctime_ns or st.st_nlink != 1:
            raise _Tampered
        change()
        self._mark()

    def length(self, idx: int) -> int:
        return min(self.part_size, self.record.size - idx * self.part_size)

    def record_parts(self) -> bool:
        """Sync the part file and record which parts it holds (the flusher calls this).

        The sync and the record are made outside ``file_lock``: writers, which take it for
        each part, do not wait for the disk. A record written after the file was finished or
        started over is a stale one, which costs at most a transfer: the record never saves
        a hash."""
        with self.file_lock:
            if self.fd < 0:
                return False
            with self.lock:
                done = sorted(self.on_disk)
            if len(done) == self.recorded:
                return False
            fd = os.dup(self.fd)
        try:
            os.fdatasync(fd)  # the record never claims bytes a power loss takes back
        finally:
            os.close(fd)
        self.parent.write_file(
            self.sidecar, PartsRecord(size=self.record.size, xxh3_128=self.record.xxh3_128,
                                      part_size=self.part_size, done=done)
            .model_dump_json().encode(), mode=0o600)
        self.recorded = len(done)
        return True

    def write(self, idx: int, data: memoryview) -> None:
        """Write part ``idx`` from ``data`` (the buffer it is later hashed from)."""
        offset = idx * self.part_size

        def pwrite() -> None:
            written = 0
            while written < len(data):
                written += os.pwrite(self.fd, data[written:], offset + written)

        with self.file_lock:
            self._change(pwrite)

    def written(self, idx: int, buffer: bytearray | None = None) -> None:
        """Part ``idx`` is wholly in the part file (the flusher may now record it); ``buffer``
        holds its bytes, to be hashed from (None: hashed from the disk)."""
        with self.lock:
            self.on_disk.add(idx)
            if buffer is not None:
                self.held[idx] = buffer

    def advance(self) -> bool:
        """Move the hash cursor over the parts on disk as far as it goes. True when this call
        verified the whole file."""
        with self.lock:
            if self.hashing:
                return False  # the thread hashing this file will pick the part up
            self.hashing = True
        while True:
            with self.lock:
                if self.cursor not in self.on_disk:
                    self.hashing = False
                    if self.cursor == self.nparts and not self.finished:
                        self.finished = True
                        break
                    return False
                i = self.cursor
                buffer = self.held.pop(i, None)
            self._hash_part(i, buffer)
            with self.lock:
                self.cursor += 1
        self._finish()
        return True

    def _hash_part(self, idx: int, buffer: bytearray | None) -> None:
        self.hashed += self.length(idx)
        if buffer is not None:
            try:
                self.hasher.update(memoryview(buffer)[: self.length(idx)])
            finally:
                self.release(buffer)
            return
        start = idx * self.part_size  # a part an earlier run left: on disk only
        try:
            feed_range(self.hasher, self.fd, start, start + self.length(idx))
        except ChangedWhileRead as exc:
            raise VerifyMismatch(
                f"{self.record.path}: the partial copy {exc}",
                hint="something other than k3a truncated it in the node cache (whoever can "
                "write the cache's directory, e.g. a pod sharing its hostPath): find and stop "
                "it, then re-run `k3a pull`; nothing was put at the final path") from None

    def _finish(self) -> None:
        got = self.hasher.hexdigests()
        problems = []
        if got.size != self.record.size:
            problems.append(f"{got.size} bytes, manifest says {self.record.size}")
        if got.xxh3_128 != self.record.xxh3_128:
            problems.append(f"xxh3-128 {got.xxh3_128}, manifest says {self.record.xxh3_128}")
        crc = self.hasher.extra_checksums().get("crc64nvme")
        if self.want_crc is not None and crc != self.want_crc:
            problems.append(f"CRC64NVME {crc}, the store recorded {self.want_crc}")
        if problems and self.resumed_bytes:
            raise _StaleParts("; ".join(problems))
        if problems:
            self.discard()
            raise VerifyMismatch(
                f"{self.record.path}: the bytes in the store do not match the manifest: "
                + "; ".join(problems) + " (the partial copy was deleted)",
                hint="the store's copy is damaged or was changed behind its manifest: restore "
                "it (re-stage the revision) and pull again; nothing was put at the final path",
            )
        with self.file_lock:
            self._change(lambda: (os.fchmod(self.fd, FILE_MODE), os.fsync(self.fd)))
            self._change(lambda: self.parent.replace(self.part, self.parent, self.name))
            self.identity = Identity.of(os.fstat(self.fd))
            os.close(self.fd)
            self.fd = -1
            self.parent.unlink(self.sidecar)

    def discard(self) -> None:
        with self.file_lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            self.parent.unlink(self.part)
            self.parent.unlink(self.sidecar)

    def close(self) -> None:
        """Stop (an error elsewhere): keep what is on disk, recorded, for the next run."""
        self.record_parts()
        with self.file_lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


class _StaleParts(Exception):
    """A file whose parts from an earlier run are in the mismatch: fetch it again whole."""


class _Tampered(Exception):
    """A part file changed by something other than this pull."""


class _Buffers:
    """Part buffers, at most ``count`` at a time; :meth:`take` waits for one to come back."""

    def __init__(self, count: int):
        self._free: list[bytearray] = []
        self._slots = threading.Semaphore(count)
        self._lock = threading.Lock()

    def take(self) -> None:
        self._slots.acquire()

    def buffer(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes for the slot :meth:`take` got."""
        with self._lock:
            while self._free:
                buf = self._free.pop()
                if len(buf) >= size:
                    return buf
        return bytearray(size)

    def give(self, buf: bytearray | None) -> None:
        if buf is not None:
            with self._lock:
                self._free.append(buf)
        self._slots.release()


@dataclass
class FetchTotals:
    bytes_fetched: int = 0
    bytes_resumed: int = 0
    #: Bytes fed to the hash: each fetched file's once (more for a file started over).
    bytes_hashed: int = 0
    files: int = 0
    #: Each verified file at its final name as the fetch left it, for the seal's re-check.
    identities: dict[str, Identity] = field(default_factory=dict)


class Fetcher:
    """Runs :class:`FileJob` s through ``tuning.concurrency`` worker threads."""

    def __init__(self, source: Source, tuning: Tuning, *,
                 on_bytes: Callable[[int], None] | None = None,
                 on_note: Callable[[str], None] | None = None):
        self.source = source
        self.tuning = tuning
        self.on_bytes = on_bytes
        self.on_note = on_note
        self.totals = FetchTotals()
        self._buffers = _Buffers(BUFFERS_PER_WORKER * tuning.concurrency)
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    def job(self, record: FileRecord, parent: Dir, name: str, want_crc: str | None) -> FileJob:
        return FileJob(record, parent, name, self.tuning.part_size, want_crc,
                       self._buffers.give)

    def run(self, jobs: list[FileJob]) -> FetchTotals:
        tasks: collections.deque[tuple[FileJob, int | None]] = collections.deque()
        for job in jobs:
            self.totals.bytes_resumed += job.resumed_bytes
            # None: nothing to fetch, only the hash of what is on disk.
            tasks.extend((job, i) for i in (job.missing or [None]))
        workers = [threading.Thread(target=self._worker, args=(tasks,), name=f"k3a-pull-{n}",
                                    daemon=True)
                   for n in range(min(self.tuning.concurrency, len(tasks)))]
        done = threading.Event()
        flusher = threading.Thread(target=self._flusher, args=(jobs, done), daemon=True,
                                   name="k3a-pull-flush")
        flusher.start()
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        done.set()
        flusher.join()
        if self._errors:
            for job in jobs:
                if not job.finished:
                    job.close()
            mismatches = [e for e in self._errors if isinstance(e, VerifyMismatch)]
            raise (mismatches or self._errors)[0]
        self.totals.bytes_hashed = sum(job.hashed for job in jobs)
        self.totals.identities = {job.record.path: job.identity for job in jobs
                                  if job.identity is not None}
        return self.totals

    def _flusher(self, jobs: list[FileJob], done: threading.Event) -> None:
        while not done.wait(FLUSH_INTERVAL):
            for job in jobs:
                if not job.finished:
                    try:
                        job.record_parts()
                    except OSError as exc:  # the next record (or the re-run) catches up
                        log.warning("recording parts of %s: %s", job.record.path, exc)

    def _worker(self, tasks: collections.deque[tuple[FileJob, int | None]]) -> None:
        chunk = memoryview(bytearray(CHUNK))
        try:
            while not self._stop.is_set():
                # The buffer before the part: the part at a file's cursor never waits for one.
                self._buffers.take()
                try:
                    job, idx = tasks.popleft()
                except IndexError:
                    self._buffers.give(None)
                    return
                if idx is None:
                    self._buffers.give(None)
                else:
                    self._fetch_part(job, idx, chunk)
                    faultpoints.pause("pull-part", f"{job.record.path}#{idx}")
                try:
                    verified = job.advance()
                except _StaleParts as exc:
                    self._start_over(job, str(exc), tasks)
                    continue
                if verified:
                    with self._lock:
                        self.totals.files += 1
        except _Tampered:
            job.discard()
            with self._lock:
                self._errors.append(changed_after_hashing([job.record.path]))
            self._stop.set()
        except BaseException as exc:  # noqa: BLE001 - handed to run(), which raises it
            with self._lock:
                self._errors.append(exc)
            self._stop.set()

    def _start_over(self, job: FileJob, why: str,
                    tasks: collections.deque[tuple[FileJob, int | None]]) -> None:
        with self._lock:
            self.totals.bytes_resumed -= job.resumed_bytes
        if self.on_note is not None:
            self.on_note(f"{job.record.path}: the parts an earlier run left on disk do not "
                         f"verify ({why}); fetching the whole file again")
        job.restart()
        tasks.extend((job, i) for i in (job.missing or [None]))

    def _fetch_part(self, job: FileJob, idx: int, chunk: memoryview) -> None:
        """Part ``idx`` into a part buffer, then into the part file from that buffer, which
        the file keeps until its cursor hashes it."""
        length = job.length(idx)
        offset = idx * job.part_size
        buffer = self._buffers.buffer(length)
        try:
            part = memoryview(buffer)[:length]
            self._receive(job, offset, length, chunk, part)
            job.write(idx, part)
        except BaseException:
            self._buffers.give(buffer)
            raise
        job.written(idx, buffer)

    def _receive(self, job: FileJob, offset: int, length: int, chunk: memoryview,
                 part: memoryview) -> None:
        for attempt in range(1, self.tuning.attempts + 1):
            if self._stop.is_set():
                raise Unavailable("stopped: another part failed")
            got = 0

            def sink(view: memoryview) -> None:
                nonlocal got
                part[got : got + len(view)] = view
                got += len(view)
                if self.on_bytes is not None:
                    self.on_bytes(len(view))

            try:
                self.source.read_range(job.record.path, offset, length, chunk, sink)
                break
            except (ShortRead, Unavailable) as exc:
                with self._lock:
                    self.totals.bytes_fetched += got
                if attempt == self.tuning.attempts:
                    raise Unavailable(
                        f"{job.record.path}: bytes {offset}-{offset + length - 1}: {exc}",
                        hint="re-run `k3a pull`: parts already on disk are kept") from exc
                log.warning("%s part %d: %s; retrying", job.record.path, offset // job.part_size,
                            exc)
                time.sleep(0.2 * 2**attempt)
            except NotFound:
                raise
        with self._lock:
            self.totals.bytes_fetched += length
