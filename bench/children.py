"""What several figures share: their options, the synthetic release on the hub, ``k3a stage``
in a child, and the loopback limits (curl, cp). Figures import this, never each other."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .env import MB, Bench, force_rmtree

REPO = "moonshotai/Kimi-K3"


@dataclass(frozen=True)
class Options:
    size: int
    shards: int
    rss_size: int
    tiny_files: int
    s3_size: int
    workers: int
    real_s3_size: int
    incr_size: int
    pull_size: int
    #: Node caches each revision is pulled onto (the headline figure).
    nodes: int = 2


def rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / MB


# ----- helpers shared by several figures --------------------------------------------------------


def stage_child(bench: Bench, endpoint: str, store_url: str, repo_id: str = REPO,
                workers: int = 4, revision: str = "main", extra_env: dict | None = None):
    """``k3a stage`` in a subprocess; returns (StageResult as dict, Child)."""
    env = dict(bench.env, **(extra_env or {}))
    child = bench.k3a(
        "stage", repo_id, "--revision", revision, "--store", store_url, "--endpoint", endpoint,
        "--workers", str(workers), "--json", "-q", env=env,
    )
    return child.json(), child


def curl_rate(bench: Bench, endpoint: str, repo_id: str, commit: str, blobs: list[Path],
              parallel: int) -> tuple[float, int]:
    """Loopback HTTP read rate of every file of the revision, ``parallel`` at a time, to
    /dev/null: the network side of the physical limit (no hashing, no disk write)."""
    from k3artifacts.staging.hub import HubSource

    src = HubSource(endpoint, token=False)
    files = src.list_files(repo_id, commit)
    argv = ["curl", "-sS", "--fail", "--parallel", "--parallel-max", str(parallel)]
    for f in files:
        argv += ["-o", "/dev/null", src.file_url(repo_id, commit, f.path)]
    total = sum(f.size for f in files)
    bench.settle(blobs)
    child = bench.run(argv)
    return rate(total, child.seconds), total


def cp_rate(bench: Bench, sources: list[Path], dest_parent: Path) -> float:
    """``cp`` of the same bytes into a directory beside the store, then ``sync``: staging
    fsyncs every file before publishing, so the copy is timed until its bytes are on disk."""
    dest = dest_parent / "cp-limit"
    dest.mkdir(parents=True)
    total = sum(p.stat().st_size for p in sources)
    bench.settle(sources)
    started = time.perf_counter()
    bench.run(["cp", *map(str, sources), str(dest)])
    os.sync()
    seconds = time.perf_counter() - started
    force_rmtree(dest)
    return rate(total, seconds)


def published_release(bench: Bench, opts: Options) -> tuple[dict[str, Path], str, list[Path]]:
    files = bench.release(opts.size, opts.shards)
    commit = bench.publish_on_hub(REPO, files)
    return files, commit, bench.blob_paths(REPO, commit)


