"""Read each safetensors file once, hash it in the same pass, and hand its tensors over.

One worker thread per file in flight. A worker reads its file front to back in aligned slices
(``read_bytes``, 4 MiB by default) into one of its two host buffers (``buffer_bytes``, pinned
where the target is CUDA), feeds each slice to xxh3-128 while it is still in the CPU's cache,
and copies each full buffer to the file's block in target memory with one asynchronous copy
while it fills the other buffer. Where the target is the CPU the slices land in the block
itself: there is no copy to make.

No tensor of a file is handed over before the whole file has been hashed and its digest
equals the signed manifest's: the file's block is the buffer that waits, and the tensors are
views of it. Host memory stays bounded (``2 * buffer_bytes`` per worker); target memory holds
at most ``files_in_flight`` files beyond what the model keeps.

A file that is not this reader's to hash (``Shard.xxh3_128`` None: another rank of the node
hashes it, :mod:`.share`) is read the same way and handed over unhashed; the load is refused
on every rank before it returns if any rank's file did not match, or if any rank read a file
other than the one its node's hashing rank hashed (each file's identity, unchanged over each
read, :mod:`.witness`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from k3artifacts.errors import VerifyMismatch
from k3artifacts.faultpoints import armed, pause
from k3artifacts.loading.shards import TensorSpan, header_length, parse_header
from k3artifacts.loading.witness import identity, open_file, settled, unchanged
from k3artifacts.nodecache.onhand import Identity

READ_BYTES = 4 << 20
BUFFER_BYTES = 64 << 20
_ALIGN = 4096
#: Bytes kept from the stream to parse the header from; a longer header is read back from the
#: block (already hashed, so the same bytes).
MAX_HEAD_PEEK = 1 << 20


class FileRefused(VerifyMismatch):
    """A file of the copy that is not the signed one: ``rel``, and ``why`` (its digests or its
    size), which a node cache records for its next pull (:mod:`k3artifacts.nodecache.refusals`)."""

    def __init__(self, rel: str, why: str, *, hint: str):
        super().__init__(f"{rel}: {why}", hint=hint)
        self.rel = rel
        self.why = why


@dataclass(frozen=True)
class Shard:
    """One file to load: where it is, what the signed manifest says of it."""

    rel: str
    path: Path
    size: int
    #: The manifest's xxh3-128; None when another rank hashes this file.
    xxh3_128: str | None


@dataclass(frozen=True)
class Loaded:
    shard: Shard
    block: torch.Tensor
    spans: list[TensorSpan]


class _Buffers:
    """A worker's two host buffers and, on CUDA, its stream and the copy pending from each."""

    def __init__(self, device: torch.device, size: int):
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.host = [torch.empty(size, dtype=torch.uint8, pin_memory=self.cuda)
                     for _ in range(2 if self.cuda else 0)]
        self.done = [None, None]

    def own(self, block: torch.Tensor) -> None:
        """Before the first copy into a freshly allocated block: the allocator may hand out
        memory that work queued on the allocating stream (a consumer's copy out of an earlier
        file's block) still reads."""
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(block.device))

    def take(self, i: int) -> torch.Tensor:
        if self.done[i] is not None:  # the copy out of this buffer must finish first
            self.done[i].synchronize()
        return self.host[i]

    def send(self, i: int, block: torch.Tensor, at: int, n: int) -> None:
        with torch.cuda.stream(self.stream):
            block[at : at + n].copy_(self.host[i][:n], non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.done[i] = event

    def finish(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


def _read_into(fd: int, view: memoryview, offset: int, shard: Shard) -> None:
    got = os.preadv(fd, [view], offset)
    if got != len(view):  # shorter than its stat said a moment ago: changing under us
        raise VerifyMismatch(
            f"{shard.rel}: ended at {offset + got} bytes while being read; the manifest "
            f"says {shard.size}",
            hint="something is writing the node's copy; restore it and restart the server")


def _none_wanted(fd: int, shard: Shard, wanted: Callable[[str], bool]) -> bool:
    """Whether no tensor of a file this reader does not hash is wanted (its header, read
    alone, decides only that the file is skipped; nothing of it is handed over)."""
    head = os.pread(fd, 8, 0)
    head += os.pread(fd, header_length(head, shard.rel, shard.size), 8)
    return not any(wanted(s.name) for s in parse_header(head, shard.rel, shard.size))


def _load_file(shard: Shard, device: torch.device, read_bytes: int, buffer_bytes: int,
               hashing: bool, wanted: Callable[[str], bool] | None,
               on_bytes: Callable[[int], None] | None,
               seen: dict[str, Identity] | None, faults: bool) -> Loaded | None:
    if faults:
        pause("load-file", shard.rel)
    fd = open_file(shard.rel, shard.path)
    try:
        shared = seen is not None
        before = settled(fd, shard.rel) if shared else identity(fd)
        size = before.size
        if size != shard.size:
            raise FileRefused(
                shard.rel, f"{size} bytes on disk, the signed manifest says {shard.size}",
                hint="the node's copy is truncated or replaced; `k3a pull` the tuple again")
        if shard.xxh3_128 is None and wanted is not None and _none_wanted(fd, shard, wanted):
            # Skipped on the strength of a header read unhashed: witnessed like a whole read.
            after = unchanged(fd, shard.rel, before, shared=shared)
            if seen is not None:
                seen[shard.rel] = after
            return None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        digest = xxhash.xxh3_128() if hashing and shard.xxh3_128 is not None else None
        block = torch.empty(size, dtype=torch.uint8, device=device)
        buffers = _Buffers(device, buffer_bytes)
        buffers.own(block)
        head = bytearray()
        offset, turn = 0, 0
        while offset < size:
            n = min(buffer_bytes, size - offset)
            target = buffers.take(turn) if buffers.cuda else block[offset : offset + n]
            raw = memoryview(target.numpy())
            for at in range(0, n, read_bytes):
                piece = raw[at : min(at + read_bytes, n)]
                _read_into(fd, piece, offset + at, shard)
                if digest is not None:
                    digest.update(piece)
                if len(head) < MAX_HEAD_PEEK and offset + at < MAX_HEAD_PEEK:
                    head += piece[: MAX_HEAD_PEEK - len(head)]
            if buffers.cuda:
                buffers.send(turn, block, offset, n)
                turn ^= 1
            offset += n
            if on_bytes is not None:
                on_bytes(n)
        buffers.finish()
        if faults:
            pause("load-read", shard.rel)
        after = unchanged(fd, shard.rel, before, shared=shared)
        if seen is not None:
            seen[shard.rel] = after
    finally:
        os.close(fd)
    if digest is not None and digest.hexdigest() != shard.xxh3_128:
        raise FileRefused(
            shard.rel, f"xxh3-128 {digest.hexdigest()}, the signed manifest says "
            f"{shard.xxh3_128}",
            hint="the node's copy differs from the signed revision; nothing was served. "
            "`k3a pull` the tuple again, or restore the file from a trusted store")
    return Loaded(shard, block, _spans(shard, block, bytes(head)))



def _spans(shard: Shard, block: torch.Tensor, head: bytes) -> list[TensorSpan]:
    n = header_length(head, shard.rel, shard.size)
    if 8 + n > len(head):
        head = bytes(block[: 8 + n].cpu().numpy())
    return parse_header(head, shard.rel, shard.size)


def _tensor(block: torch.Tensor, span: TensorSpan) -> torch.Tensor:
    dtype = getattr(torch, span.dtype)
    raw = block[span.start : span.end]
    if span.start % dtype.itemsize:  # a view needs its element alignment; copy this one
        raw = raw.clone()
    return raw.view(dtype).reshape(span.shape)


def stream_tensors(
    shards: list[Shard],
    device: torch.device | str,
    *,
    threads: int = 8,
    files_in_flight: int | None = None,
    read_bytes: int = READ_BYTES,
    buffer_bytes: int = BUFFER_BYTES,
    hashing: bool = True,
    wanted: Callable[[str], bool] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    seen: dict[str, Identity] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every file, file by file in the order given, each file's only
    after it was read whole and (``hashing``, where its ``xxh3_128`` is set) matched.
    ``wanted``: tensors this rank keeps (the others are not handed over; a file with none of
    them is not read unless this reader hashes it). ``seen``: given when the node's ranks share
    the hashing out; filled with each file's identity as this reader read it (hashed or not),
    for :func:`~k3artifacts.loading.share.agree`."""
    device = torch.device(device)
    if read_bytes % _ALIGN or buffer_bytes % read_bytes:
        raise ValueError("read_bytes must be a multiple of 4096 and divide buffer_bytes")
    ahead = max(1, files_in_flight or threads)
    faults = armed()
    with ThreadPoolExecutor(max_workers=max(1, min(threads, ahead)),
                            thread_name_prefix="k3a-load") as pool:
        pending: list[Future[Loaded | None]] = []
        queue = iter(shards)

        def top_up() -> None:
            for shard in queue:
                pending.append(pool.submit(_load_file, shard, device, read_bytes,
                                           buffer_bytes, hashing, wanted, on_bytes, seen,
                                           faults))
                if len(pending) >= ahead:
                    return

        top_up()
        try:
            while pending:
                loaded = pending.pop(0).result()
                top_up()
                for span in [] if loaded is None else loaded.spans:
                    if wanted is None or wanted(span.name):
                        yield span.name, _tensor(loaded.block, span)
                del loaded
        finally:
            for future in pending:
                future.cancel()
