"""Many ranged reads in flight, written in place, hashed in order as the bytes land.

Each file to fetch is preallocated (``posix_fallocate``) as ``.<name>.part`` (opened in its
directory's descriptor, never through a link) and cut into parts;
``Tuning.concurrency`` worker threads take parts in file order and stream each one from the
source through their own small chunk buffer into the file with ``pwrite``: memory is
``concurrency * CHUNK`` whatever the shard or part size. Parts finish out of order, so each
file keeps a hash cursor: whichever thread completes the part at the cursor hashes it, and
any later parts already complete, from the page cache while those bytes are still hot there
(read into a small buffer, never mapped: a part file truncated by something else sharing the
cache's directory is a named refusal, not a SIGBUS). Parts are handed out in order, so the
cursor trails the newest part by at most ``concurrency`` parts. Every byte crosses the network
once, is written once and is read back from memory once; parts a previous run left on disk are
hashed the same way.

A flusher thread records which parts are on disk in a sidecar (``.<name>.part.json``) once a
second, each time after an ``fdatasync``, so a killed pull resumes from the last record
without fetching those parts again; workers never wait for it. The record saves a transfer,
never a hash: a file is renamed to its final name only when all of its bytes, resumed parts
included, hash in this run to its xxh3-128 (and the store's CRC64NVME, when recorded). A
mismatch in a file with resumed parts (planted, or torn on disk) fetches the whole file
again; a mismatch in bytes all fetched by this run deletes it and names the store's copy.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from k3artifacts import faultpoints
from k3artifacts.errors import ConfigError, NotFound, Unavailable, VerifyMismatch
from k3artifacts.nodecache.layout import PartsRecord
from k3artifacts.nodecache.safefs import FILE_MODE, Dir
from k3artifacts.revisions.hashing import MultiHasher, feed_range
from k3artifacts.revisions.hashworker import ChangedWhileRead
from k3artifacts.revisions.manifest import FileRecord
from k3artifacts.stores.base import RangeReader as Source
from k3artifacts.stores.base import ShortRead

log = logging.getLogger(__name__)

MiB = 1 << 20
#: Bytes each worker moves per read/write call: big enough that syscalls cost nothing, small
#: enough that memory stays a few MiB per worker.
CHUNK = 1 * MiB
#: Seconds between sidecar records (each costs an fdatasync per file in flight).
FLUSH_INTERVAL = 1.0


@dataclass(frozen=True)
class Tuning:
    """Defaults measured against SeaweedFS on loopback (bench/RESULTS.md, figure 8): 512 MiB
    in shards of 256 MiB down to 8 MiB, 16 MiB x 16 in flight gave 490-630 MB/s; 8 MiB parts
    ~300, 32-64 MiB ~400-530, 8 or 32 in flight less than 16. On EC2 against S3 more in
    flight pays (S3 serves ~100 MB/s per connection): raise --concurrency there."""

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
    """One file being fetched: its part file, which parts are on disk, its hash cursor.

    Every name is opened in ``parent`` (a directory descriptor) without following links."""

    def __init__(self, record: FileRecord, parent: Dir, name: str, part_size: int,
                 want_crc: str | None):
        self.record = record
        self.parent = parent
        self.name = name
        self.part = part_name(name)
        self.sidecar = sidecar_name(name)
        self.want_crc = want_crc
        self.part_size = part_size
        self.fd = -1
        done = self._resume(part_size)
        self.nparts = -(-record.size // self.part_size)
        self.on_disk: set[int] = set(done)
        self.resumed_bytes = sum(self.length(i) for i in done)
        self.missing = [i for i in range(self.nparts) if i not in self.on_disk]
        self.hasher = MultiHasher(sha256=False, xxh3=True, crc64nvme=want_crc is not None)
        self.cursor = 0
        self.hashing = False
        self.finished = False
        self.lock = threading.Lock()
        #: Held while the part file's fd or sidecar changes (record, finish, close).
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
                # the record: only a part file this pull alone names is resumed.
                if st.st_size == rec.size and st.st_nlink == 1:
                    self.part_size = rec.part_size  # the parts on disk are cut that way
                    self.fd = fd
                    nparts = -(-self.record.size // self.part_size)
                    return sorted({i for i in rec.done if 0 <= i < nparts})
                os.close(fd)
        self._fresh()
        return []

    def _fresh(self) -> None:
        """An empty part file in place of whatever is there, and no record of parts."""
        self.parent.unlink(self.sidecar)
        self.fd = self.parent.create_new(self.part)
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

    def length(self, idx: int) -> int:
        return min(self.part_size, self.record.size - idx * self.part_size)

    def record_parts(self) -> bool:
        """Sync the part file and record which parts it holds (the flusher calls this)."""
        with self.file_lock:
            if self.fd < 0:
                return False
            with self.lock:
                done = sorted(self.on_disk)
            if len(done) == self.recorded:
                return False
            os.fdatasync(self.fd)  # the record never claims bytes a power loss takes back
            self.parent.write_file(
                self.sidecar, PartsRecord(size=self.record.size, xxh3_128=self.record.xxh3_128,
                                          part_size=self.part_size, done=done)
                .model_dump_json().encode(), mode=0o644)
            self.recorded = len(done)
            return True

    def written(self, idx: int) -> None:
        """Part ``idx`` is wholly in the part file (the flusher may now record it)."""
        with self.lock:
            self.on_disk.add(idx)

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
            self._hash_part(i)
            with self.lock:
                self.cursor += 1
        self._finish()
        return True

    def _hash_part(self, idx: int) -> None:
        start = idx * self.part_size
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
            os.fchmod(self.fd, FILE_MODE)
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            self.parent.replace(self.part, self.parent, self.name)
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


@dataclass
class FetchTotals:
    bytes_fetched: int = 0
    bytes_resumed: int = 0
    files: int = 0


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
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    def job(self, record: FileRecord, parent: Dir, name: str, want_crc: str | None) -> FileJob:
        return FileJob(record, parent, name, self.tuning.part_size, want_crc)

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
        buf = memoryview(bytearray(CHUNK))
        try:
            while not self._stop.is_set():
                try:
                    job, idx = tasks.popleft()
                except IndexError:
                    return
                if idx is not None:
                    self._fetch_part(job, idx, buf)
                    job.written(idx)
                    faultpoints.pause("pull-part", f"{job.record.path}#{idx}")
                try:
                    verified = job.advance()
                except _StaleParts as exc:
                    self._start_over(job, str(exc), tasks)
                    continue
                if verified:
                    with self._lock:
                        self.totals.files += 1
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

    def _fetch_part(self, job: FileJob, idx: int, buf: memoryview) -> None:
        length = job.length(idx)
        offset = idx * job.part_size
        for attempt in range(1, self.tuning.attempts + 1):
            if self._stop.is_set():
                raise Unavailable("stopped: another part failed")
            position = offset

            def sink(view: memoryview) -> None:
                nonlocal position
                written = 0
                while written < len(view):
                    written += os.pwrite(job.fd, view[written:], position + written)
                position += written
                if self.on_bytes is not None:
                    self.on_bytes(written)

            try:
                self.source.read_range(job.record.path, offset, length, buf, sink)
                break
            except (ShortRead, Unavailable) as exc:
                with self._lock:
                    self.totals.bytes_fetched += position - offset
                if attempt == self.tuning.attempts:
                    raise Unavailable(
                        f"{job.record.path}: bytes {offset}-{offset + length - 1}: {exc}",
                        hint="re-run `k3a pull`: parts already on disk are kept") from exc
                log.warning("%s part %d: %s; retrying", job.record.path, idx, exc)
                time.sleep(0.2 * 2**attempt)
            except NotFound:
                raise
        with self._lock:
            self.totals.bytes_fetched += length
