"""What a Prefect run of stage-release costs over the bare library on the same release.

    python bench/prefect_overhead.py [--size 256MiB] [--shards 8] [--repeat 3]

A synthetic Kimi-K3-shaped release is served by the local hub on loopback; each run stages it
into a fresh file store (nothing reused), alternating the bare ``k3artifacts.staging.engine.stage``
(what ``k3a stage`` runs) and the ``stage-release`` flow with the same worker count. With
PREFECT_API_URL unset the flow runs in Prefect's ephemeral mode: its first run in this process
includes starting that server, reported separately ("first flow run"). Prints seconds per run
and the median overhead.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from k3artifacts.cli.common import ByteSize
from k3artifacts.localhub import LocalHub
from k3artifacts.localhub.synthetic import write_release
from k3artifacts.staging.engine import StageOptions, stage
from k3artifacts.staging.hub import HubSource
from k3artifacts.stores.file import FileStore

REPO = "moonshotai/Kimi-K3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--size", default="256MiB", type=lambda v: ByteSize().convert(v, None, None)
    )
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    os.environ["K3A_WORKERS"] = str(args.workers)
    tmp = Path(tempfile.mkdtemp(prefix="k3a-bench-"))
    if "PREFECT_HOME" not in os.environ:
        os.environ["PREFECT_HOME"] = str(tmp / "prefect-home")

    files = write_release(tmp / "release", total_bytes=args.size, shards=args.shards)
    hub = LocalHub(tmp / "hub")
    hub.add_commit(REPO, files)
    endpoint = hub.start()
    from flows.stage_release import stage_release  # after PREFECT_HOME is set

    def bare(i: int) -> float:
        store = FileStore(tmp / f"bare-{i}")
        t = time.perf_counter()
        stage(HubSource(endpoint=endpoint, token=False), store, REPO, "main",
              tmp / f"bare-q-{i}", StageOptions(workers=args.workers))
        return time.perf_counter() - t

    def flow(i: int) -> float:
        store = FileStore(tmp / f"flow-{i}")
        t = time.perf_counter()
        stage_release(repo_id=REPO, revision="main", store_url=store.url,
                      quarantine=str(tmp / f"flow-q-{i}"), endpoint=endpoint)
        return time.perf_counter() - t

    try:
        total = sum(p.stat().st_size for p in files.values())
        print(f"release: {len(files)} files, {total / 1e6:.0f} MB; workers {args.workers}; "
              f"API: {os.environ.get('PREFECT_API_URL') or 'ephemeral'}")
        print(f"first flow run (Prefect start-up included): {flow(-1):.2f} s")
        bare_s, flow_s = [], []
        for i in range(args.repeat):
            bare_s.append(bare(i))
            flow_s.append(flow(i))
            print(f"run {i}: bare {bare_s[-1]:.2f} s, flow {flow_s[-1]:.2f} s")
        b, f = statistics.median(bare_s), statistics.median(flow_s)
        print(f"median: bare {b:.2f} s, flow {f:.2f} s, overhead {f - b:+.2f} s ({f / b:.2f}x)")
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
