"""Incremental staging (issue 11): what a revision changing one small file pulls from the Hub.

For a file store and for a real S3 server (SeaweedFS on loopback): ``k3a stage`` of a full
revision, then of the next upstream revision, which changes ``generation_config.json`` only.
The figure is the bytes the second staging pulled from the Hub (the stager's own count of
bytes received; the tests hold it to what the hub sent), against that file's size, with the
time of that staging next to the time of the full one.
"""

from __future__ import annotations

import uuid

from k3artifacts.localhub.synthetic import derive_revision
from tests.support.seaweed import SeaweedS3

from .env import Bench, Row
from .staging import stage_child

CHANGED = "generation_config.json"


def _row(store: str, files: dict, changed_size: int, full: dict, second: dict) -> Row:
    pulled = second["downloaded_bytes"]
    return Row(
        f"10 bytes pulled from the Hub for a revision changing one small file ({store})",
        pulled, "bytes", f"{CHANGED} size", changed_size, None, "== that file",
        pulled == changed_size,
        note=f"staging it took {second['seconds']:.2f}s vs {full['seconds']:.1f}s for the full "
             f"revision ({full['total_bytes'] / 2**20:.0f} MiB in {len(files)} files); "
             f"{second['reused_bytes']:,} bytes reused inside the store (a file tree: hard "
             f"links; S3: references to the published objects, "
             f"{second['store_stats'].get('bytes_copied', 0):,} bytes copied), "
             f"plan {second['plan']}",
        extra={"full_seconds": full["seconds"], "incremental_seconds": second["seconds"],
               "reused_bytes": second["reused_bytes"], "store_stats": second["store_stats"]},
    )


def incremental(bench: Bench, opts, shared: dict) -> list[Row]:

    rows = []
    files = bench.release(opts.incr_size, opts.shards, seed=7)
    with bench.hub() as hub, SeaweedS3(bench.fresh("seaweedfs-incr")) as server:
        env = dict(bench.env, **server.env)
        env.pop("AWS_SESSION_TOKEN", None)
        stores = (
            ("file store", "bench/incr-file", f"file://{bench.fresh('store-incr')}", None),
            ("SeaweedFS S3", "bench/incr-s3",
             f"s3://{server.create_bucket(f'k3a-bench-{uuid.uuid4().hex[:8]}')}/k3a", env),
        )
        for name, repo, url, extra_env in stores:
            commit = bench.publish_on_hub(repo, files)
            bench.settle(bench.blob_paths(repo, commit))
            full, _ = stage_child(bench, hub, url, repo_id=repo, workers=opts.workers,
                                  extra_env=extra_env)
            changed = derive_revision(files, bench.fresh(f"rev2-{repo.rsplit('/', 1)[-1]}"),
                                      change=CHANGED)
            bench.publish_on_hub(repo, changed)
            second, _ = stage_child(bench, hub, url, repo_id=repo, workers=opts.workers,
                                    extra_env=extra_env)
            rows.append(_row(name, files, changed[CHANGED].stat().st_size, full, second))
    return rows
