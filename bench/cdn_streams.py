"""Staging from a CDN that paces each connection, as a long path does, next to what a user would
run instead: ``hf download`` (one stream per file, 8 files at once) then ``sha256sum``.

On loopback one connection moves gigabytes a second, so the number of streams per file hides
behind the CPU. From huggingface.co's CDN to another region one TCP stream carries tens of
MB/s, and a 1.56 TB checkpoint in a few dozen multi-GB shards is as fast as its connections.
The hub here paces every file answer to ``--stream-rate``; the same bytes are staged by
``k3a stage --streams 1``, by ``k3a stage`` with its default ranges, and by the peer, in one
run. Ratios are the peer's time over k3a's (above 1: k3a is faster).

    python -m bench --only streams --stream-size 1GiB --stream-rate 32MiB
"""

from __future__ import annotations

from .env import MB, Bench, Row
from .staging import stage_child
from .tools import hf_argv

REPO = "bench/cdn-streams"
#: Four shards of a quarter of the size each: fewer files than files at once, as the last
#: shards of any large checkpoint are.
SHARDS = 4


def cdn_streams(bench: Bench, opts, shared: dict) -> list[Row]:
    del shared
    files = bench.release(opts.stream_size, SHARDS, seed=14)
    commit = bench.publish_on_hub(REPO, files)
    blobs = bench.blob_paths(REPO, commit)
    total = sum(p.stat().st_size for p in blobs)
    hf = hf_argv()
    rate = opts.stream_rate
    rows: list[Row] = []
    with bench.hub(stream_rate=rate) as endpoint:
        peer = None
        if hf is not None:
            cache = bench.fresh("hf-cache")
            bench.settle(blobs)
            env = dict(bench.env, HF_ENDPOINT=endpoint)
            download = bench.run([*hf, "download", REPO, "--revision", commit, "--cache-dir",
                                  str(cache), "--quiet"], env=env)
            snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit
            check = bench.run(["sh", "-c", 'cd "$1" && sha256sum -- * > /dev/null', "sh",
                               str(snapshot)])
            peer = download.seconds + check.seconds
        for streams in (1, None):
            store = bench.fresh("store-streams")
            bench.settle(blobs)
            args = () if streams is None else ("--streams", str(streams))
            _, child = stage_child(bench, endpoint, f"file://{store}", repo_id=REPO,
                                   workers=opts.workers, revision=commit, extra_args=args)
            label = "default streams" if streams is None else f"--streams {streams}"
            ratio = None if peer is None else peer / child.seconds
            rows.append(Row(
                f"14 stage from a CDN paced per connection, {label}", total / child.seconds / MB,
                "MB/s", "hf download + sha256sum", None if peer is None else total / peer / MB,
                ratio, ">= 1.0" if streams is None else "",
                None if ratio is None or streams is not None else ratio >= 1.0,
                note=f"{total / 2**30:.2f} GiB in {SHARDS} shards, {rate / MB:.0f} MB/s per "
                f"connection, {opts.workers} files at once; k3a {child.seconds:.1f}s, peer "
                + ("not run (no hf CLI)" if peer is None else f"{peer:.1f}s"),
            ))
    return rows
