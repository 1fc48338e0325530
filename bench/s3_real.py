"""Staging to a real S3 server (SeaweedFS on loopback) next to ``s5cmd cp`` of the same bytes.

s5cmd is what a user would run to put files already on disk into S3: it reads and uploads,
nothing else. ``k3a stage`` also downloads every byte from the hub, hashes it three ways
(sha256, xxh3-128, CRC64NVME), checks it, writes it to quarantine and reads S3's stored
checksum back. The ratio is s5cmd's time over ours (1.0: staging costs no more than the bare
upload), both measured in this run against one server.
"""

from __future__ import annotations

import os
import uuid

from tests.support.seaweed import SeaweedS3

from .env import MB, Bench, Row, cache_note
from .staging import stage_child
from .tools import s5cmd

REPO = "bench/s3-real"
ROUNDS = 2


def stage_vs_s5cmd(bench: Bench, opts, shared: dict) -> list[Row]:

    files = bench.release(opts.real_s3_size, opts.shards, seed=5)
    commit = bench.publish_on_hub(REPO, files)
    blobs = bench.blob_paths(REPO, commit)
    total = sum(p.stat().st_size for p in blobs)
    upload_dir = bench.fresh("s5cmd-src")
    for path, src in files.items():  # the same bytes, named as upstream, without a copy
        os.link(src, upload_dir / path.replace("/", "__"))
    # Rounds alternate the sides, best of ROUNDS each: s5cmd's own rate moved from 780 to 980
    # MB/s between single runs on the 16-core machine, more than the change being measured.
    best_s5 = best_stage = None
    with SeaweedS3(bench.fresh("seaweedfs")) as server, bench.hub() as hub:
        env = dict(bench.env, **server.env)
        env.pop("AWS_SESSION_TOKEN", None)
        for _ in range(ROUNDS):
            plain_bucket = server.create_bucket(f"k3a-bench-{uuid.uuid4().hex[:8]}")
            bench.settle(blobs)
            s5 = bench.run([s5cmd(), "--endpoint-url", server.endpoint, "--numworkers",
                            str(max(8, opts.workers * 4)), "cp", f"{upload_dir}/*",
                            f"s3://{plain_bucket}/s5cmd/"], env=env)
            if best_s5 is None or s5.seconds < best_s5.seconds:
                best_s5 = s5
            bucket = server.create_bucket(f"k3a-bench-{uuid.uuid4().hex[:8]}")
            bench.settle(blobs)
            staged = stage_child(bench, hub, f"s3://{bucket}/k3a", repo_id=REPO,
                                 workers=opts.workers, extra_env=env)
            if best_stage is None or staged[0]["seconds"] < best_stage[0]["seconds"]:
                best_stage = staged
    s5, (result, child) = best_s5, best_stage
    ours, base = total / result["seconds"] / MB, total / s5.seconds / MB
    ratio = ours / base
    tuning = (f"parts {env.get('K3A_S3_PART_SIZE', '16MiB')}, "
              f"{env.get('K3A_S3_CONCURRENCY', '8')} in flight per file, "
              f"{env.get('K3A_S3_BUFFER', '192MiB')} of parts in memory")
    return [Row(
        "8 stage -> S3 (SeaweedFS)", ours, "MB/s", "s5cmd cp of the same files", base, ratio,
        ">= 0.9", ratio >= 0.9,
        note=f"{total / 2**30:.2f} GiB in {len(files)} files, {opts.workers} files at once, "
             f"{tuning}; staging includes the hub download, three hashes, the quarantine "
             f"write and the checksum read-back, s5cmd only reads and uploads; SeaweedFS runs "
             f"on the same cores; best of {ROUNDS} alternating rounds; {cache_note(bench)}; "
             f"stage used {child.cpu_seconds:.1f} CPU-s and peak RSS "
             f"{child.max_rss / 2**20:.0f} MiB, s5cmd {s5.cpu_seconds:.1f} CPU-s and "
             f"{s5.max_rss / 2**20:.0f} MiB",
        extra={"s5cmd_seconds": s5.seconds, "stage_seconds": result["seconds"],
               "store_stats": result.get("store_stats", {})},
    )]
