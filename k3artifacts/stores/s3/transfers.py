"""How s3transfer and our own part uploads move bytes: part sizes, concurrency, counters and
progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from k3artifacts.budget import ByteBudget
from k3artifacts.settings import load
from k3artifacts.stores.base import ProgressCallback

if TYPE_CHECKING:
    from s3transfer.manager import TransferConfig

MiB = 1024 * 1024
GiB = 1024 * MiB
#: Bytes gathered before a transfer's progress is handed on (see Progress).
PROGRESS_STEP = 8 * MiB
#: S3's limit on parts per multipart upload.
MAX_PARTS = 10_000


@dataclass(frozen=True)


class TransferTuning:
    """How s3transfer moves one file. Defaults suit multi-GB shards on a large instance.

    Memory stays bounded: parts are read from the file as they are sent (never buffered
    whole), at most ``max_concurrency`` parts are in flight per file, and the parts in memory
    across all files hold at most ``buffer_bytes``.
    """

    #: Files at least this big move in parts (parallel, retried one by one): in-bucket copies
    #: (s3transfer's) and verified files put whole (ours, :meth:`put_in_parts`).
    multipart_threshold: int = 64 * MiB
    #: Smallest part; grown per file so that no file needs more than MAX_PARTS parts.
    min_part_size: int = 64 * MiB
    #: Parallel part uploads (or part copies) per file.
    max_concurrency: int = 8
    #: Bytes per second across one transfer, or None for no limit.
    max_bandwidth: int | None = None
    #: Part size of uploads this package sends itself (streamed while downloading, or from a
    #: verified file): each part in flight is one buffer.
    stream_part_size: int = 16 * MiB
    #: Bytes of those buffers held at once by the process, across every file it sends
    #: (:class:`PartBuffers`): memory follows this, not parts times files in flight. 12
    #: parts of 16 MiB: on 16 cores (SeaweedFS, 4 GiB in 24 files, 8 at once) 815 MB/s and
    #: a 450 MiB peak, against 828 MB/s and 681 MiB unbounded and 747 MB/s, 500 MiB at
    #: 256 MiB (s5cmd's rate moved 873-909 between those runs).
    buffer_bytes: int = 192 * MiB

    @classmethod
    def from_env(cls) -> TransferTuning:
        """Defaults, overridden by ``K3A_S3_PART_SIZE`` (also the multipart threshold),
        ``K3A_S3_CONCURRENCY`` (parts in flight per file) and ``K3A_S3_BUFFER`` (part bytes in
        memory): what a staging worker reads, so every process of a run moves bytes the same
        way."""
        tuning = cls()
        settings = load()
        if settings.s3_part_size is not None:
            size = settings.s3_part_size
            tuning = dataclasses.replace(tuning, multipart_threshold=size, min_part_size=size,
                                         stream_part_size=size)
        if settings.s3_concurrency is not None:
            tuning = dataclasses.replace(tuning, max_concurrency=settings.s3_concurrency)
        if settings.s3_buffer is not None:
            tuning = dataclasses.replace(tuning, buffer_bytes=settings.s3_buffer)
        return tuning

    def part_size(self, size: int) -> int:
        """Part size for a file of ``size`` bytes: ``min_part_size``, or the smallest whole MiB
        that keeps the upload within S3's 10,000 parts (64 MiB parts reach 625 GiB; a 1 TiB
        file gets 105 MiB parts)."""
        needed = math.ceil(size / MAX_PARTS)
        return max(self.min_part_size, math.ceil(needed / MiB) * MiB)

    def in_parts(self, size: int) -> bool:
        """A file of at least one stream part is sent as our own parts (streamed while it
        downloads, or from the verified file); smaller ones go as one PUT, which over plain
        HTTP signs the payload: a second sha256 of the file, read by the signer under the
        GIL."""
        return size >= self.stream_part_size

    def put_in_parts(self, size: int) -> bool:
        """Whether a verified file put whole goes as our own parts: from one stream part, as
        :meth:`in_parts`, or from the multipart threshold where that is lower."""
        return self.in_parts(size) or size >= self.multipart_threshold

    def upload_part_size(self, size: int) -> int:
        """Part size of a streamed upload of ``size`` bytes, grown like :meth:`part_size`."""
        needed = math.ceil(size / MAX_PARTS)
        return max(min(self.stream_part_size, self.min_part_size),
                   math.ceil(needed / MiB) * MiB)

    def config(self, size: int) -> TransferConfig:
        # s3transfer is imported only by what moves a file through it (a whole-file upload,
        # an in-bucket copy): a pull or a sign starts without it (issue 22).
        from s3transfer.manager import TransferConfig

        return TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.part_size(size),
            max_request_concurrency=self.max_concurrency,
            max_submission_concurrency=2,
            max_in_memory_upload_chunks=self.max_concurrency,
            max_bandwidth=self.max_bandwidth,
        )


class PartBuffers:
    """The buffers parts are read into and sent from, lent to one part at a time and kept
    for the next: at most ``limit`` bytes of them at once across every file of the process
    (a :class:`~k3artifacts.budget.ByteBudget`), each ``size`` bytes. Reused, not allocated
    per part, they stay as resident as they were and the allocator keeps no freed 16 MiB
    blocks of its own beside them: memory is the budget, whatever the files in flight. A part
    larger than ``size`` (grown for a file of S3's 10,000 parts) gets a buffer of its own,
    under the same budget."""

    def __init__(self, limit: int, size: int):
        self.size = size
        self._budget = ByteBudget(limit)
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lend(self, length: int) -> Iterator[memoryview]:
        """A buffer of ``length`` bytes for the block (its contents: whatever was in it)."""
        size = max(length, self.size)
        with self._budget.held(size):
            with self._lock:
                buf = self._free.pop() if size == self.size and self._free else None
            if buf is None:
                buf = bytearray(size)
            try:
                # Not released on the way out: a request object may still hold a slice of it;
                # the buffer is never resized, so a stale view reads bytes, never freed memory.
                yield memoryview(buf)[:length]
            finally:
                if size == self.size:
                    with self._lock:
                        self._free.append(buf)


@dataclass


class TransferCounters:
    """What went over the wire, for tests, benchmarks and the staging report. Thread-safe."""

    bytes_uploaded: int = 0
    bytes_copied: int = 0
    objects_uploaded: int = 0
    objects_copied: int = 0
    objects_skipped: int = 0
    #: Files a new revision reads where a published one keeps them: no byte moved.
    objects_referenced: int = 0
    bytes_referenced: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}


class Progress:
    """Counts one transfer's bytes for the counters and the progress callback (an s3transfer
    subscriber: s3transfer calls the ``on_*`` methods a subscriber has).

    s3transfer reports every block http.client sends (8-16 KiB), hundreds of thousands of
    calls per GiB from its worker threads; a profile of a 4 GiB staging found 7% of it in the
    callback. Bytes are therefore gathered here and handed on once per PROGRESS_STEP and when
    the transfer ends, so counters and the display stay exact at the end and cost nothing
    in between."""

    def __init__(self, path: str, counters: list[TransferCounters], field_name: str,
                 callback: ProgressCallback | None):
        self.path = path
        self.counters = counters
        self.field_name = field_name
        self.callback = callback
        self._pending = 0
        self._lock = threading.Lock()

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        with self._lock:
            self._pending += bytes_transferred
            if -PROGRESS_STEP < self._pending < PROGRESS_STEP:
                return
            amount, self._pending = self._pending, 0
        self._hand_on(amount)

    def on_done(self, future: Any, **kwargs: Any) -> None:
        with self._lock:
            amount, self._pending = self._pending, 0
        if amount:
            self._hand_on(amount)

    def _hand_on(self, amount: int) -> None:
        for counters in self.counters:
            counters.add(**{self.field_name: amount})
        if self.callback is not None:
            self.callback(self.path, amount)
