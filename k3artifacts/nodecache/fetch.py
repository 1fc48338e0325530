"""Many ranged reads in flight, written in place, hashed in order as the bytes arrive.

Each file to fetch is preallocated (``posix_fallocate``) as ``.<name>.part`` and cut into parts;
a fixed set of worker threads takes parts in file order, reads each into one of a fixed pool
of part buffers (``Tuning.buffers`` of them: memory is ``buffers * part_size`` whatever the
shard size) and writes it with ``pwrite``. Parts finish out of order, so each file keeps a
hash cursor: the thread that completes the part at the cursor hashes it straight from its
buffer, and any later parts already waiting, then returns those buffers to the pool. A part
that is ahead of the cursor keeps its buffer until then; since parts are handed out in order,
the part at the cursor is always in flight, so that wait is short and never a deadlock. Every
byte is therefore read from the network once and hashed from memory once; parts a previous
run left on disk are hashed from the page cache (``mmap``) once.

Which parts are on disk is recorded in a sidecar (``.<name>.part.json``) after an
``fdatasync``, at most once per second per file, so a killed pull resumes from the last
record and never trusts bytes that were not synced. A file is renamed to its final name only
when its xxh3-128 (and the store's CRC64NVME, when recorded) match; a mismatch deletes it.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from k3artifacts import faultpoints
from k3artifacts.errors import K3AError, NotFound, Unavailable, VerifyMismatch
from k3artifacts.nodecache.layout import PartsRecord
from k3artifacts.nodecache.sources import ShortRead, Source
from k3artifacts.revisions.hashing import MultiHasher
from k3artifacts.revisions.manifest import FileRecord

log = logging.getLogger(__name__)

MiB = 1 << 20
#: Seconds between sidecar records of one file (each costs an fdatasync).
FLUSH_INTERVAL = 1.0


@dataclass(frozen=True)
class Tuning:
    """Defaults from bench/pull.py on loopback SeaweedFS (bench/RESULTS.md): 8 MiB parts and
    16 in flight saturate it; more parts in flight only add memory."""

    part_size: int = 8 * MiB
    concurrency: int = 16
    #: HTTP connections of the S3 client (one per worker unless said otherwise).
    connections: int | None = None
    #: Parts allowed to wait, finished, for an earlier part of their file to be hashed.
    window: int | None = None
    attempts: int = 4

    def __post_init__(self) -> None:
        if self.part_size < MiB or self.part_size % mmap.ALLOCATIONGRANULARITY:
            raise K3AError(f"part size {self.part_size} must be a multiple of 1 MiB")
        if self.concurrency < 1:
            raise K3AError("concurrency must be at least 1")

    @property
    def pool_connections(self) -> int:
        return self.connections or self.concurrency

    @property
    def buffers(self) -> int:
        return self.concurrency + (self.window if self.window is not None else self.concurrency)


def part_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.part")


def sidecar_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.part.json")


class _Pool:
    def __init__(self, count: int, size: int):
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(bytearray(size))

    def get(self, stop: threading.Event) -> bytearray | None:
        while not stop.is_set():
            try:
                return self._free.get(timeout=0.2)
            except queue.Empty:
                continue
        return None

    def put(self, buf: bytearray) -> None:
        self._free.put(buf)


class FileJob:
    """One file being fetched: its part file, which parts are on disk, its hash cursor."""

    def __init__(self, record: FileRecord, final: Path, part_size: int, want_crc: str | None,
                 pool: _Pool):
        self.record = record
        self.final = final
        self.part = part_path(final)
        self.sidecar = sidecar_path(final)
        self.want_crc = want_crc
        self.pool = pool
        self.part_size = part_size
        done = self._resume(part_size)
        self.nparts = -(-record.size // self.part_size)
        self.on_disk: set[int] = set(done)
        self.resumed_bytes = sum(self.length(i) for i in done)
        self.missing = [i for i in range(self.nparts) if i not in self.on_disk]
        self.hasher = MultiHasher(sha256=False, xxh3=True, crc64nvme=want_crc is not None)
        self.pending: dict[int, bytearray | None] = {i: None for i in done}
        self.cursor = 0
        self.hashing = False
        self.finished = False
        self.lock = threading.Lock()
        self.flush_lock = threading.Lock()
        self.last_flush = 0.0
        self.recorded = len(done)

    def _resume(self, part_size: int) -> list[int]:
        """Parts a previous run recorded, if its part file is still the same file."""
        try:
            rec = PartsRecord.model_validate_json(self.sidecar.read_bytes())
            size = self.part.stat().st_size
        except (FileNotFoundError, ValueError):
            rec = None
        if (rec is not None and rec.size == self.record.size == size
                and rec.xxh3_128 == self.record.xxh3_128 and rec.part_size <= part_size):
            self.part_size = rec.part_size
            self.fd = os.open(self.part, os.O_RDWR)
            return sorted(set(rec.done))
        self.sidecar.unlink(missing_ok=True)
        self.fd = os.open(self.part, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        if self.record.size:
            # One extent up front: no fragmentation from out-of-order writes, and ENOSPC now
            # rather than after most of a shard has crossed the network.
            os.posix_fallocate(self.fd, 0, self.record.size)
        return []

    def length(self, idx: int) -> int:
        return min(self.part_size, self.record.size - idx * self.part_size)

    # ---- bytes on disk -------------------------------------------------------------------
    def written(self, idx: int) -> None:
        with self.lock:
            self.on_disk.add(idx)
        now = time.monotonic()
        if now - self.last_flush >= FLUSH_INTERVAL and self.flush_lock.acquire(blocking=False):
            try:
                recorded = self._record(now)
            finally:
                self.flush_lock.release()
            if recorded:
                faultpoints.pause("pull-recorded", self.record.path)

    def _record(self, now: float) -> bool:
        with self.lock:
            done = sorted(self.on_disk)
        if len(done) == self.recorded:
            return False
        os.fdatasync(self.fd)  # the record never claims bytes a power loss could take back
        tmp = self.sidecar.with_name(self.sidecar.name + ".tmp")
        tmp.write_bytes(PartsRecord(size=self.record.size, xxh3_128=self.record.xxh3_128,
                                    part_size=self.part_size, done=done).model_dump_json()
                        .encode())
        os.replace(tmp, self.sidecar)
        self.last_flush = now
        self.recorded = len(done)
        return True

    # ---- hashing in order ----------------------------------------------------------------
    def hashed(self, idx: int, buf: bytearray | None) -> bool:
        """Part ``idx`` is on disk (its bytes still in ``buf`` if given): advance the cursor
        as far as it goes. Returns True when this call finished the file (it is verified)."""
        with self.lock:
            if idx >= 0:
                self.pending[idx] = buf
            if self.hashing:
                return False
            self.hashing = True
        while True:
            with self.lock:
                if self.cursor not in self.pending:
                    self.hashing = False
                    if self.cursor == self.nparts and not self.finished:
                        self.finished = True
                        break
                    return False
                i = self.cursor
                held = self.pending.pop(i)
            try:
                self._hash_part(i, held)
            finally:
                if held is not None:
                    self.pool.put(held)
            with self.lock:
                self.cursor += 1
        self._finish()
        return True

    def _hash_part(self, idx: int, held: bytearray | None) -> None:
        length = self.length(idx)
        if held is not None:
            with memoryview(held) as view, view[:length] as part:
                self.hasher.update(part)
            return
        # Left on disk by a previous run: read once, from the page cache, without a copy.
        with mmap.mmap(self.fd, length, access=mmap.ACCESS_READ,
                       offset=idx * self.part_size) as mapped, memoryview(mapped) as view:
            self.hasher.update(view)

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
        if problems:
            self.discard()
            raise VerifyMismatch(
                f"{self.record.path}: the bytes in the store do not match the manifest: "
                + "; ".join(problems) + " (the partial copy was deleted)",
                hint="the store's copy is damaged or was changed behind its manifest: restore "
                "it (re-stage the revision) and pull again; nothing was put at the final path",
            )
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        os.chmod(self.part, 0o444)
        os.replace(self.part, self.final)
        self.sidecar.unlink(missing_ok=True)

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.part.unlink(missing_ok=True)
        self.sidecar.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop (an error elsewhere): keep what is on disk, recorded, for the next run."""
        if self.fd >= 0:
            with self.flush_lock:
                self._record(time.monotonic())
            os.close(self.fd)
            self.fd = -1


@dataclass
class FetchTotals:
    bytes_fetched: int = 0
    bytes_resumed: int = 0
    files: int = 0


class Fetcher:
    """Runs :class:`FileJob` s through ``tuning.concurrency`` worker threads."""

    def __init__(self, source: Source, tuning: Tuning, *,
                 on_bytes: Callable[[int], None] | None = None,
                 on_verified: Callable[[FileRecord], None] | None = None):
        self.source = source
        self.tuning = tuning
        self.on_bytes = on_bytes
        self.on_verified = on_verified
        self.pool = _Pool(tuning.buffers, tuning.part_size)
        self.totals = FetchTotals()
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    def job(self, record: FileRecord, final: Path, want_crc: str | None) -> FileJob:
        return FileJob(record, final, self.tuning.part_size, want_crc, self.pool)

    def run(self, jobs: list[FileJob]) -> FetchTotals:
        tasks: collections.deque[tuple[FileJob, int]] = collections.deque()
        for job in jobs:
            self.totals.bytes_resumed += job.resumed_bytes
            # -1: nothing to fetch, only the hash of what is on disk.
            tasks.extend((job, i) for i in (job.missing or [-1]))
        threads = [threading.Thread(target=self._worker, args=(tasks,), name=f"k3a-pull-{n}",
                                    daemon=True)
                   for n in range(min(self.tuning.concurrency, len(tasks)))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._errors:
            for job in jobs:
                if not job.finished:
                    job.close()
            mismatches = [e for e in self._errors if isinstance(e, VerifyMismatch)]
            raise (mismatches or self._errors)[0]
        return self.totals

    def _worker(self, tasks: collections.deque[tuple[FileJob, int]]) -> None:
        try:
            while True:
                buf = self.pool.get(self._stop)
                if buf is None:
                    return
                try:
                    job, idx = tasks.popleft()
                except IndexError:
                    self.pool.put(buf)
                    return
                if idx < 0:
                    self.pool.put(buf)
                    buf = None
                else:
                    self._fetch_part(job, idx, buf)
                if job.hashed(idx, buf):
                    with self._lock:
                        self.totals.files += 1
                    if self.on_verified is not None:
                        self.on_verified(job.record)
        except BaseException as exc:  # noqa: BLE001 - handed to run(), which raises it
            with self._lock:
                self._errors.append(exc)
            self._stop.set()

    def _fetch_part(self, job: FileJob, idx: int, buf: bytearray) -> None:
        length = job.length(idx)
        offset = idx * job.part_size
        view = memoryview(buf)[:length]
        for attempt in range(1, self.tuning.attempts + 1):
            if self._stop.is_set():
                raise Unavailable("stopped: another part failed")
            try:
                self.source.read_into(job.record.path, offset, view)
                break
            except (ShortRead, Unavailable) as exc:
                if attempt == self.tuning.attempts:
                    raise Unavailable(
                        f"{job.record.path}: bytes {offset}-{offset + length - 1}: {exc}",
                        hint="re-run `k3a pull`: parts already on disk are kept") from exc
                log.warning("%s part %d: %s; retrying", job.record.path, idx, exc)
                time.sleep(0.2 * 2**attempt)
            except NotFound:
                raise
        written = 0
        while written < length:
            written += os.pwrite(job.fd, view[written:], offset + written)
        job.written(idx)
        with self._lock:
            self.totals.bytes_fetched += length
        if self.on_bytes is not None:
            self.on_bytes(length)
