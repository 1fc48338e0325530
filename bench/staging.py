"""What several figures share: the release they stage and ``k3a stage`` as a child process.

Kept apart from :mod:`bench.figures` so the figure modules it imports lazily (incremental,
s3_real, signing) need not import it back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .env import Bench

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
    start_runs: int
    #: Node caches each revision is pulled onto (the headline figure).
    nodes: int = 2
    #: The paced-CDN figure: checkpoint size, and bytes/s per connection.
    stream_size: int = 1 << 30
    stream_rate: int = 32 * 2**20
    #: Where the warm-start figure compiles: cuda (inductor + Triton) or cpu (C++ codegen).
    device: str = "cuda"
    #: Alternating rounds of the verify figure (best and median of each side).
    verify_runs: int = 5
    #: Rounds of the floor figure (issue 36), and the checkout its baseline k3a runs from.
    floor_runs: int = 5
    baseline_code: str | None = None
    #: The load figure (issue 42): checkpoint size and shards, rounds, reader threads.
    load_size: int = 16 << 30
    load_shards: int = 16
    load_runs: int = 3
    load_threads: int = 8
    #: The history figure (issue 41): how far S3 is, each request held this long.
    history_delay_ms: float = 5.0
    #: The eval-latency figure (issue 40): the test server's fixed delay before the first
    #: token, in ms, under the 0-5 ms jitter (0: the server as it is).
    eval_first_token_ms: float = 0.0
    #: The node-start figure (issue 42): checkpoint size and shards, rounds, the extra
    #: arguments of the k3a path's ``k3a pull``, the interpreter that has vLLM.
    node_size: int = 1 << 30
    node_shards: int = 4
    node_runs: int = 1
    vllm_python: str | None = None


def stage_child(bench: Bench, endpoint: str, store_url: str, repo_id: str = REPO,
                workers: int = 4, revision: str = "main", extra_env: dict | None = None,
                extra_args: tuple[str, ...] = ()):
    """``k3a stage`` in a subprocess; returns (StageResult as dict, Child)."""
    env = dict(bench.env, **(extra_env or {}))
    child = bench.k3a(
        "stage", repo_id, "--revision", revision, "--store", store_url, "--endpoint", endpoint,
        "--workers", str(workers), "--json", "-q", *bench.stage_args, *extra_args, env=env,
    )
    return child.json(), child


def published_release(bench: Bench, opts: Options) -> tuple[dict[str, Path], str, list[Path]]:
    files = bench.release(opts.size, opts.shards)
    commit = bench.publish_on_hub(REPO, files)
    return files, commit, bench.blob_paths(REPO, commit)
