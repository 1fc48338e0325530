"""k3a pull and k3a cache: a node's local copy of a release's weights."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import click

from k3artifacts.cli.app import AliasGroup
from k3artifacts.cli.common import (
    ByteSize,
    emit,
    from_settings,
    get_store,
    json_option,
    progress_options,
    reporter,
    resumable,
    store_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.errors import NotFound


def _default_root() -> Path:
    from k3artifacts.nodecache.layout import default_root

    return default_root()


def _default_tuning(field: str) -> Callable[[], int]:
    def default() -> int:
        from k3artifacts.nodecache.fetch import Tuning

        return getattr(Tuning(), field)

    return default


root_option = click.option(
    "--to", "--root", "root", type=click.Path(file_okay=False, path_type=Path),
    default=from_settings(_default_root), show_default="$K3A_NODE_CACHE",
    help="Node cache root; revisions land under ROOT/models/<org>/<name>/<commit>/.",
)


@exits(
    (0, "done"),
    (4, "a file (named) read from the store does not match the manifest, the manifest does not "
        "parse, or the copy here does not match and a server leases it (left as it is)"),
    (7, "unknown tuple or revision"),
    (8, "store unreachable, or not enough space / the disk filled (re-run: parts on disk are "
        "kept)"),
    (9, "a link planted in the cache (named; nothing was written through it), or an "
        "unfinished pull's directory that another account owns or others can write"),
)
@click.command("pull")
@click.argument("target")
@store_option
@root_option
@click.option("--part-size", type=ByteSize(), default=_default_tuning("part_size"),
              show_default="16MiB",
              help="Bytes per ranged read; files larger than this are read in parallel parts.")
@click.option("--concurrency", type=int, default=_default_tuning("concurrency"), show_default="16",
              help="Ranged reads in flight (across and within files).")
@click.option("--connections", type=int, default=None,
              help="S3 connections in the pool  [default: --concurrency]")
@click.option("--keep", type=click.IntRange(min=1), default=None,
              help="After the pull, keep only the N most recently used revisions (leased "
              "ones are never evicted).")
@click.option("--gpu", default=None,
              help="Also bring the tuple's warm-start artifact for this GPU model (as "
              "nvidia-smi names it)  [default: detected with nvidia-smi; none: no warm start]")
@click.option("--no-warm", is_flag=True, help="Weights only: no warm-start artifact.")
@click.option("--channel", default=None,
              help="Channel whose policy governs the warm start  [default: TARGET when it is "
              "a channel]")
@click.option("--verified-by-loader", is_flag=True,
              help="The server loads these weights with --load-format k3a, which hashes every "
              "file as it reads it: files already on this node are kept on their kind and size, "
              "not re-hashed, except those the loader refused (recorded under "
              "ROOT/.k3a-cache/refused/), which are fetched again. Files fetched are hashed as "
              "they are written either way.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or log lines.")
@progress_options
@json_option
@resumable
def pull_cmd(target, store_url, root, part_size, concurrency, connections, keep, gpu, no_warm,
             channel, verified_by_loader, quiet, progress_interval, log_format, as_json):
    """Put a release's weights on this node's disk, verified as the bytes arrive.

    TARGET is a tuple id, a channel (its current tuple) or org/name@<commit>. The manifest
    must have the digest the tuple binds; each file's xxh3-128 (and the store's CRC64NVME)
    is checked before it is renamed into place, and the revision directory appears only when
    complete, read-only. Nothing on the node's disk is taken on trust: a copy already here, a
    killed pull's files and parts, and files of other cached revisions (same sha256, then
    hard-linked) are kept only when their bytes hash to the manifest in this run, one file
    per core; any other file is fetched again. Nothing under the root is reached through a
    link.
    For a tuple or channel, the tuple's warm-start artifact for this node's GPU follows
    (verified, held to the channel's policy; any reason not to is a named miss on stderr,
    never a failure: `k3a warm --help`).
    """
    from k3artifacts.nodecache.fetch import Tuning
    from k3artifacts.nodecache.layout import CacheLayout
    from k3artifacts.nodecache.pull import PullObserver, pull, resolve_target
    from k3artifacts.nodecache.retention import gc
    from k3artifacts.reporting.progress import BytesProgress

    tuning = Tuning(part_size=part_size, concurrency=concurrency, connections=connections)
    store = get_store(store_url)
    resolved = resolve_target(store, target)
    with reporter("pulling", quiet=quiet, as_json=as_json, interval=progress_interval,
                  log_format=log_format) as progress:
        bar = BytesProgress(progress)

        def planned(total: int, already: int) -> None:
            bar.set_total(total)
            bar(already)

        def note(text: str) -> None:
            if not quiet:  # stderr: a --json reader still sees why a pull waited
                click.echo(f"k3a: {text}", err=True)

        observer = PullObserver(planned=planned, advance=bar, note=note)
        result = pull(resolved, root, tuning=tuning, observer=observer,
                      verified_by_loader=verified_by_loader)
    warm = None
    if resolved.tuple_id is not None and not no_warm:
        warm = _pull_warm(store, target, resolved.tuple_id, root, gpu, channel)
        if not quiet and warm.ok:  # a miss was logged where it was found: said once
            click.echo(f"k3a: {warm.line()}", err=True)
    if keep is not None:
        swept = gc(CacheLayout(root), keep, protect=frozenset({result.revision}))
        result.evicted = swept.evicted
        _drop_orphan_warm(root)

    def human() -> None:
        if result.already_present:
            click.echo(f"already here: {result.path}")
            if result.bytes_hashed:
                click.echo(f"  verified: re-hashed {result.files} files, {result.bytes:,} bytes "
                           f"in {result.seconds:.2f} s (xxh3-128); manifest digest "
                           f"{result.manifest_digest}")
            else:
                click.echo(f"  {result.files} files, {result.bytes:,} bytes, not re-hashed: the "
                           "verified load hashes them as it reads them; manifest digest "
                           f"{result.manifest_digest}")
        else:
            rate = result.bytes_fetched / max(result.seconds, 1e-9)
            click.echo(f"pulled {result.revision} to {result.path}")
            click.echo(f"  {result.files} files, {result.bytes:,} bytes: fetched "
                       f"{result.bytes_fetched:,} ({rate / 1e6:.0f} MB/s), reused "
                       f"{result.bytes_reused:,}, resumed {result.bytes_resumed:,}; hashed "
                       f"{result.bytes_hashed:,} (of which re-read from this disk "
                       f"{result.bytes_rehashed:,})")
            click.echo(f"  verified: {', '.join(result.algorithms)}; manifest digest "
                       f"{result.manifest_digest}")
        for evicted in result.evicted:
            click.echo(f"  evicted {evicted}")

    emit(as_json, {**result.__dict__, "warm": warm.as_dict() if warm else None}, human)


def _pull_warm(store, target: str, tuple_id: str, root: Path, gpu: str | None,
               channel: str | None):
    from k3artifacts.releases.lookup import resolve_tuple
    from k3artifacts.releases.tuples import TUPLE_ID
    from k3artifacts.revisions.refs import match_revision_ref
    from k3artifacts.warm import prewarm
    from k3artifacts.warm.model import detect_gpu

    release = resolve_tuple(store, tuple_id)
    if channel is None and not TUPLE_ID.match(target) and match_revision_ref(target) is None:
        channel = target
    gpu = gpu or detect_gpu()
    trust = prewarm.policy_or_miss(store, channel, release.id, gpu)
    if isinstance(trust, prewarm.WarmOutcome):
        return trust
    return prewarm.fetch(store, release, root, gpu=gpu, trust=trust)


def _drop_orphan_warm(root: Path) -> list[str]:
    """Warm artifacts live as long as their tuple's weights on this node."""
    from k3artifacts.nodecache.layout import CacheLayout
    from k3artifacts.nodecache.retention import list_cached
    from k3artifacts.warm.node import drop_warm

    return drop_warm(root, {c.revision for c in list_cached(CacheLayout(root))
                            if not c.partial})


@click.group("cache", cls=AliasGroup, aliases={"ls": "list"})
def cache_group():
    """The node cache: list, remove, collect, and lease revisions for a running server."""


@exits(0)
@cache_group.command("list")
@root_option
@json_option
def cache_ls(root, as_json):
    """Cached revisions, most recently used first, with whether a server leases them; then
    unfinished pulls (re-run the pull to resume one, `k3a cache gc` frees them)."""
    from k3artifacts.nodecache.layout import CacheLayout
    from k3artifacts.nodecache.retention import list_cached
    from k3artifacts.reporting.progress import human_size
    from k3artifacts.warm.node import list_warm

    cached = list_cached(CacheLayout(root))
    warm = list_warm(root)

    def human() -> None:
        for w in warm:
            click.echo(f"warm {w.tuple_id} {w.gpu} {w.layout}  {human_size(w.bytes):>10}  "
                       f"{w.files:5d} files  "
                       + ("partial (`k3a cache gc` frees it)" if w.partial
                          else f"(weights {w.revision})"))
        for c in cached:
            click.echo(f"{c.revision}  {human_size(c.bytes):>10}  {c.files:5d} files"
                       f"{'  leased' if c.leased else ''}{'  partial' if c.partial else ''}")

    emit(as_json, [{"kind": "weights", **c.__dict__} for c in cached]
         + [{"kind": "warm", **w.__dict__} for w in warm], human)


@exits((0, "removed"), (6, "a server leases it, or a pull of it is running"),
       (7, "not in the cache"), (9, "a malformed revision"))
@cache_group.command("rm")
@click.argument("revision")
@root_option
def cache_rm(revision, root):
    """Remove org/name@<commit> from the cache (refused while a server leases it)."""
    from k3artifacts.nodecache.layout import CacheLayout, parse_revision
    from k3artifacts.nodecache.retention import remove

    remove(CacheLayout(root), parse_revision(revision))
    _drop_orphan_warm(root)
    click.echo(f"removed {revision}")


@exits((0, "collected"))
@cache_group.command("gc")
@click.option("--keep", type=click.IntRange(min=0), required=True,
              help="Revisions to keep (most recently used).")
@root_option
@json_option
def cache_gc(keep, root, as_json):
    """Evict least recently used revisions beyond --keep; leased ones are never evicted.
    Unfinished pulls (of weights and of warm artifacts) that no pull is running are deleted."""
    from k3artifacts.nodecache.layout import CacheLayout
    from k3artifacts.nodecache.retention import gc
    from k3artifacts.warm.node import drop_warm_partials

    result = gc(CacheLayout(root), keep)
    warm_dropped = _drop_orphan_warm(root)
    warm_partials = drop_warm_partials(root)

    def human() -> None:
        for rev in result.partials:
            click.echo(f"removed unfinished pull {rev}")
        for rev in result.evicted:
            click.echo(f"evicted {rev}")
        for rev in result.leased:
            click.echo(f"kept {rev}: in use")
        for path in warm_dropped:
            click.echo(f"removed warm artifact {path} (its weights are gone)")
        for path in warm_partials:
            click.echo(f"removed unfinished warm pull {path}")

    emit(as_json, {**result.__dict__, "warm_removed": warm_dropped,
                   "warm_partials_removed": warm_partials}, human)


@exits((0, "COMMAND's own exit code once it runs"), (7, "REVISION is not in the cache"),
       (9, "a malformed revision"))
@cache_group.command("lease", context_settings={"ignore_unknown_options": True})
@click.argument("revision")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@root_option
def cache_lease(revision, command, root):
    """Run COMMAND holding a lease on REVISION (org/name@<commit>): never evicted meanwhile.

    \b
    e.g. k3a cache lease moonshotai/Kimi-K3@<commit> -- vllm serve /cache/models/...
    The lease is a shared flock that COMMAND inherits (k3a execs it): it lasts exactly as
    long as COMMAND runs, and a killed server releases it. `flock -s <lease file> COMMAND`
    holds the same lease where k3a is not installed.
    """
    from k3artifacts.nodecache import locks
    from k3artifacts.nodecache.layout import CacheLayout, parse_revision

    layout = CacheLayout(root)
    rev = parse_revision(revision)
    locks.take_lease(layout, rev)
    if layout.marker(rev) is None:
        raise NotFound(f"{rev} is not in the cache at {layout.root}",
                       hint=f"pull it first: k3a pull {rev} --to {layout.root}")
    layout.touch_used(rev)
    sys.stdout.flush()
    os.execvp(command[0], list(command))
