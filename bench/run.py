"""Command line of the benchmark: ``python -m bench [--size 4GiB] [--only NAME] [--json]``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

from k3artifacts import settings
from k3artifacts.settings import default_workers

from .env import Bench, Row, force_rmtree


def parse_size(text: str) -> int:
    try:
        return settings.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    # Below 1 a third decimal: a share of 0.154 against a target of 0.15 must not print 0.15.
    return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.3f}"


def table(rows: list[Row]) -> str:
    head = ["figure", "value", "limit / baseline", "ratio", "target", "result"]
    body = []
    for r in rows:
        base = (
            f"{_fmt(r.baseline)} ({r.baseline_name})" if r.baseline is not None else r.baseline_name
        )
        result = "-" if r.passed is None else ("pass" if r.passed else "MISS")
        body.append([r.figure, f"{_fmt(r.value)} {r.unit}", base, _fmt(r.ratio), r.target, result])
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(b) for b in body]
    notes = [f"- {r.figure}: {r.note}" for r in rows if r.note]
    return "\n".join(out + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    from .figures import FIGURES, Options

    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="k3artifacts benchmarks (issue 6): each figure against its physical limit "
        "or hand-written baseline, measured in this run on this machine.",
    )
    p.add_argument("--size", type=parse_size, default=parse_size("2GiB"),
                   help="synthetic checkpoint size for staging and verify (default 2GiB)")
    p.add_argument("--shards", type=int, default=8, help="shards of that checkpoint (default 8)")
    p.add_argument("--rss-size", type=parse_size, default=parse_size("1GiB"),
                   help="size of the one-shard vs many-shards RSS releases (default 1GiB; "
                   "the issue's figure is 4GiB)")
    p.add_argument("--tiny-files", type=int, default=2000, help="files in the per-file figure")
    p.add_argument("--s3-size", type=parse_size, default=parse_size("48MiB"),
                   help="checkpoint size for the S3 figures (moto is slow; default 48MiB)")
    p.add_argument("--real-s3-size", type=parse_size, default=parse_size("1536MiB"),
                   help="checkpoint size for the SeaweedFS staging figure (default 1536MiB)")
    p.add_argument("--incr-size", type=parse_size, default=parse_size("512MiB"),
                   help="checkpoint size for the incremental-revision figure, staged into a "
                   "file store and into SeaweedFS (default 512MiB)")
    p.add_argument("--pull-size", type=parse_size, default=parse_size("1GiB"),
                   help="revision size for the k3a pull figure (SeaweedFS; default 1GiB)")
    p.add_argument("--stream-size", type=parse_size, default=parse_size("1GiB"),
                   help="checkpoint size for the paced-CDN figure (4 shards; default 1GiB)")
    p.add_argument("--stream-rate", type=parse_size, default=parse_size("32MiB"),
                   help="bytes/s the hub paces each connection to in that figure (default "
                   "32MiB, one long-distance TCP stream)")
    p.add_argument("--nodes", type=int, default=2,
                   help="node caches each revision is pulled onto in the headline (default 2)")
    p.add_argument("--cores", type=int, default=None,
                   help="run the benchmark and every child on this many CPUs (sched affinity; "
                   "default: all), to show a smaller machine's figures on a larger one")
    p.add_argument("--start-runs", type=int, default=9,
                   help="fresh processes timed per command in the cli-start figure (median)")
    p.add_argument("--verify-runs", type=int, default=5,
                   help="alternating rounds of the verify figure (best and median of each)")
    p.add_argument("--floor-runs", type=int, default=5,
                   help="rounds of the floor figure (median and fastest of each side)")
    p.add_argument("--load-size", type=parse_size, default=parse_size("16GiB"),
                   help="load figure: synthetic bf16 checkpoint size (default 16GiB)")
    p.add_argument("--load-shards", type=int, default=16,
                   help="load figure: shards of that checkpoint (default 16)")
    p.add_argument("--load-runs", type=int, default=3,
                   help="load figure: alternating rounds (best and median of each side)")
    p.add_argument("--load-threads", type=int, default=8,
                   help="load figure: files k3a's reader reads at once (default 8)")
    p.add_argument("--node-size", type=parse_size, default=parse_size("1GiB"),
                   help="node-start figure: weights of its tiny-architecture Llama (float32; "
                   "default 1GiB)")
    p.add_argument("--node-shards", type=int, default=4,
                   help="node-start figure: shards of those weights (default 4)")
    p.add_argument("--node-runs", type=int, default=1,
                   help="node-start figure: alternating rounds of both paths (fastest kept)")
    p.add_argument("--vllm-python", default=None,
                   help="node-start figure: the interpreter that has vLLM (default: the "
                   "checkout's .venv-vllm/bin/python)")
    p.add_argument("--history-delay-ms", type=float, default=5.0,
                   help="history figure: each S3 request held this long before SeaweedFS")
    p.add_argument("--baseline-code", type=Path, default=None,
                   help="floor figure: also run k3a from this checkout (PYTHONPATH), the code "
                   "before a change, in the same rounds")
    p.add_argument("--eval-first-token-ms", type=float, default=0.0,
                   help="eval-latency figure: the test server's fixed delay before the first "
                   "token (ms), under its 0-5 ms jitter (default 0: the server as it is)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="concurrent files (default: k3a stage's, one per core from 2 to 8)")
    p.add_argument("--streams", type=int, default=None,
                   help="k3a stage --streams for every staging leg (default: k3a stage's)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="warm-start figure: compile on the GPU (max-autotune, Triton) or, to "
                   "exercise the script without one, on the CPU (inductor C++ codegen); load "
                   "figure: into GPU or host memory")
    p.add_argument("--only", action="append", choices=sorted(FIGURES),
                   help="run only this figure (repeatable)")
    p.add_argument("--cold", action="store_true",
                   help="drop the page cache before each timed side (root only); default: "
                   "inputs warm in the page cache for every side")
    p.add_argument("--workdir", type=Path,
                   default=Path(os.environ.get("TMPDIR", "/tmp")) / "k3a-bench",
                   help="synthetic releases (kept between runs) and scratch stores")
    p.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    args = p.parse_args(argv)
    if args.cores is not None:
        # Children inherit the mask: k3a, SeaweedFS, the hub and s5cmd share these cores.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: max(1, args.cores)])

    bench = Bench(args.workdir, cold=args.cold)
    if args.streams is not None:
        bench.stage_args = ("--streams", str(args.streams))
    opts = Options(size=args.size, shards=args.shards, rss_size=args.rss_size,
                   tiny_files=args.tiny_files, s3_size=args.s3_size,
                   workers=args.workers, real_s3_size=args.real_s3_size,
                   incr_size=args.incr_size, pull_size=args.pull_size,
                   nodes=args.nodes, stream_size=args.stream_size,
                   stream_rate=args.stream_rate, start_runs=args.start_runs, device=args.device,
                   verify_runs=args.verify_runs, floor_runs=args.floor_runs,
                   load_size=args.load_size, load_shards=args.load_shards,
                   load_runs=args.load_runs, load_threads=args.load_threads,
                   history_delay_ms=args.history_delay_ms,
                   node_size=args.node_size, node_shards=args.node_shards,
                   node_runs=args.node_runs,
                   vllm_python=args.vllm_python,
                   eval_first_token_ms=args.eval_first_token_ms,
                   baseline_code=None if args.baseline_code is None
                   else str(args.baseline_code))
    names = args.only or list(FIGURES)
    rows: list[Row] = []
    shared: dict = {}
    started = time.time()
    try:
        for name in names:
            bench.log(f"figure: {name}")
            rows += FIGURES[name](bench, opts, shared)
    finally:
        force_rmtree(bench.scratch)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(started)),
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.node()} {len(os.sched_getaffinity(0))} of {os.cpu_count()} "
                   f"cores, load {os.getloadavg()[0]:.1f}",
        "seconds": round(time.time() - started, 1),
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))
    else:
        print(f"{meta['date']}  {meta['command']}  ({meta['machine']}, {meta['seconds']}s)\n")
        print(table(rows))
    return 0 if all(r.passed is not False for r in rows) else 1
