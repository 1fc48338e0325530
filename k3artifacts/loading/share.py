"""Which files each rank of a server hashes, and the one answer every rank gives.

The ranks of one node read the node's one copy. Each file of the plan is hashed by exactly
one of them: the node's ranks, in rank order, share the files out (largest first to the least
loaded), so a node hashes each byte once whatever its tensor-parallel size. A rank still reads
every file whose tensors it needs and hands over, unhashed, those of files another rank of the
node hashes. Expert-parallel ranks that need no tensor of a file skip it unless it is theirs to
hash: then they read it whole, so every file is covered byte for byte however the experts are
spread.

Before any rank returns from loading, every rank of the server (every node) says whether its
share matched; one refusal anywhere refuses the load on all of them. No rank serves a tensor of
a file until the rank that hashed it said the file matched.
"""

from __future__ import annotations

import socket
from dataclasses import replace

from k3artifacts.errors import VerifyMismatch
from k3artifacts.loading.stream import Shard


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


def agree(refusal: VerifyMismatch | None, group) -> None:
    """Raise on every rank of ``group`` if any rank refused its share; ``refusal`` is this
    rank's own (raised as is, naming the file)."""
    import torch
    import torch.distributed as dist

    refused = refusal is not None
    if group is not None and dist.is_initialized() and dist.get_world_size(group) > 1:
        flag = torch.tensor([int(refused)], dtype=torch.int32)
        dist.all_reduce(flag, group=group)
        refused = bool(flag.item())
    if refusal is not None:
        raise refusal
    if refused:
        raise VerifyMismatch(
            "another rank of this server refused the weights it hashed (its log names the "
            "file and the digests); this rank's tensors are not served",
            hint="the node's copy differs from the signed revision; `k3a pull` the tuple again")
