"""Which files each rank of a server hashes, and the one answer every rank gives.

The ranks of one node read the node's one copy. Each file of the plan is hashed by exactly
one of them: the node's ranks, in rank order, share the files out (largest first to the least
loaded), so a node hashes each byte once whatever its tensor-parallel size. A rank still reads
every file whose tensors it needs and hands over, unhashed, those of files another rank of the
node hashes. Expert-parallel ranks that need no tensor of a file skip it unless it is theirs to
hash: then they read it whole, so every file is covered byte for byte however the experts are
spread.

Before any rank returns from loading, every rank of the server (every node) says whether its
share matched, and the identity (device, inode, size, mtime, ctime) each file had over its
read; one refusal anywhere refuses the load on all of them, and so does a file that a rank read
unhashed with another identity than the one its node's hashing rank saw (written or replaced
between or during the reads: :mod:`.witness` says why the identity shows every such change).
No rank serves a tensor of a file until the rank that hashed it said the file matched, and
that it was the file this rank read.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace

from k3artifacts.errors import K3AError, VerifyMismatch
from k3artifacts.faultpoints import pause
from k3artifacts.loading.stream import Shard
from k3artifacts.loading.witness import describe
from k3artifacts.nodecache.onhand import Identity


def node_share(shards: list[Shard], index: int, count: int) -> list[Shard]:
    """``shards`` with the digest kept only on the files rank ``index`` of ``count`` on this
    node hashes (the others: ``xxh3_128`` None, read unhashed)."""
    loads = [0] * count
    mine = set()
    for shard in sorted(shards, key=lambda s: (-s.size, s.rel)):
        who = min(range(count), key=lambda r: (loads[r], r))
        loads[who] += shard.size
        if who == index:
            mine.add(shard.rel)
    return [s if s.rel in mine else replace(s, xxh3_128=None) for s in shards]


def node_position(group) -> tuple[int, int]:
    """(this rank's index among the ranks of its node, their number), over ``group`` (a
    torch.distributed process group; None: alone)."""
    import torch.distributed as dist

    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return 0, 1
    hosts: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    here = dist.get_rank(group)
    same = [r for r, h in enumerate(hosts) if h == hosts[here]]
    return same.index(here), len(same)


@dataclass(frozen=True)
class Account:
    """What one rank tells the others once it has read its files."""

    host: str
    #: Its own refusal, as it words it (naming the file), or None.
    refused: str | None
    #: Each file it read (or skipped on its header): whether it hashed it, and its identity.
    reads: dict[str, tuple[bool, Identity]]


def agree(refusal: K3AError | None, group, shards: list[Shard],
          seen: dict[str, Identity]) -> None:
    """Raise on every rank of ``group`` if any rank refused its share, or read a file that was
    not the one its node's hashing rank hashed. ``refusal`` is this rank's own (raised as is,
    naming the file); ``shards``: its share (:func:`node_share`); ``seen``: the identities its
    reads saw (:func:`~k3artifacts.loading.stream.stream_tensors`)."""
    import torch.distributed as dist

    pause("load-agree")
    hashed = {s.rel for s in shards if s.xxh3_128 is not None}
    mine = Account(socket.gethostname(), None if refusal is None else str(refusal),
                   {rel: (rel in hashed, ident) for rel, ident in seen.items()})
    accounts, here = [mine], 0
    if group is not None and dist.is_initialized() and dist.get_world_size(group) > 1:
        accounts, here = [None] * dist.get_world_size(group), dist.get_rank(group)
        dist.all_gather_object(accounts, mine, group=group)
    if refusal is not None:
        raise refusal
    differing = _differing(accounts)
    refused = [f"rank {rank}: {a.refused}" for rank, a in enumerate(accounts) if a.refused]
    # A rank that refused stopped reading: the files it had yet to hash have no identity to
    # compare with, so its refusal, not a difference, is what every other rank reports.
    for rank, rel, read, hashed_as in [] if refused else differing:
        if rank == here:
            raise VerifyMismatch(
                f"{rel}: this rank read it unhashed as {describe(read)}; the rank of this node "
                f"that hashed it saw {describe(hashed_as)}: written or replaced on the node "
                "between or during the reads",
                hint="restore the node's copy (`k3a pull` the tuple again) and restart the "
                "server; nothing was served")
    why = refused or [f"rank {rank}: {rel} was written or replaced between or during the reads"
                      for rank, rel, _, _ in differing]
    if why:
        raise VerifyMismatch(
            "another rank of this server refused the weights it hashed or read; this rank's "
            "tensors are not served (" + "; ".join(why) + ")",
            hint="the node's copy differs from the signed revision; `k3a pull` the tuple again")


def _differing(accounts: list[Account]) -> list[tuple[int, str, Identity, Identity | None]]:
    """(rank, file, what it read, what the hashing rank of its node saw) for each file a rank
    read unhashed as another file than the one hashed (every rank computes the same list)."""
    hashed_as = {(a.host, rel): ident for a in accounts
                 for rel, (hashed, ident) in a.reads.items() if hashed}
    return [(rank, rel, ident, hashed_as.get((a.host, rel))) for rank, a in enumerate(accounts)
            for rel, (hashed, ident) in a.reads.items()
            if not hashed and hashed_as.get((a.host, rel)) != ident]
