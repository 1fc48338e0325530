"""Figure 4: verification at the machine's hashing limit (issue 36).

The limit is one hashing process per core over the same files: ``N`` processes of ``python -c``
(N = usable cores), each hashing a disjoint share of the revision's files (largest first to the
least loaded), timed from the moment every one of them has started (imports done) to the last
exit: the hashing alone, stricter than a whole-process time whose interpreter starts would
dominate a small revision (the whole time is in the note).
Against it, in the same rounds (sides alternate; best and median of ``--verify-runs``):

- ``k3a verify`` (xxh3-128) and ``verify --full`` (sha256): the library call in a child,
  timed after imports (the hashing processes ``--full`` starts are inside the time);
- a re-pull of the unchanged revision into a node cache that holds it (``k3a pull``, which
  re-hashes every byte; the time the pull reports, the lock and the store's manifest read
  included);
- a pod start on a node that holds the revision: what the rendered init containers run,
  ``k3a pull`` then ``k3a verify DIR --expect-digest``, two whole processes;
- threads against processes for each algorithm (``hash_files`` with each, same files), the
  measurement behind where each algorithm hashes (``parallel.in_processes``: beyond 8 workers
  and 1 GiB, xxh3-128 too runs in processes; each row's note says which k3a chose).

    python -m bench --only verify [--size 4GiB --shards 64] [--verify-runs 5]
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from .env import MB, Bench, Row, cache_note
from .staging import REPO, Options, published_release, stage_child

#: One hashing process of the limit: its share of the files, hashed as fast as Python can
#: (a whole-file map read a window at a time, the way the probe of 2026-12-06 found fastest),
#: once every process has started and said so.
_LIMIT_CHILD = """
import hashlib, mmap, os, sys, xxhash
new = {"xxh3-128": xxhash.xxh3_128, "sha256": hashlib.sha256}[sys.argv[1]]
print("ready", flush=True)
sys.stdin.read(1)
for path in sys.argv[2:]:
    h = new()
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size:
            with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as m, memoryview(m) as v:
                for off in range(0, size, 8 << 20):
                    h.update(v[off:off + (8 << 20)])
    h.hexdigest()
"""

#: Starts the limit's processes, waits until each has imported its hasher, then lets them all
#: go: ``seconds`` from the go to the last exit (the limit), ``whole`` from the first start.
_LIMIT_RUNNER = """
import json, subprocess, sys, time
algorithm, code = sys.argv[1], sys.argv[2]
shares = json.loads(sys.argv[3])
start = time.perf_counter()
procs = [subprocess.Popen([sys.executable, "-c", code, algorithm, *share],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) for share in shares]
for p in procs:
    assert p.stdout.readline().strip() == b"ready"
go = time.perf_counter()
for p in procs:
    p.stdin.close()
assert all(p.wait() == 0 for p in procs)
end = time.perf_counter()
print(json.dumps({"seconds": end - go, "whole": end - start}))
"""

_OURS_CHILD = """
import json, os, sys, time
from pathlib import Path
what, store_url, repo, commit = sys.argv[1:5]
if what in ("fast", "full"):
    from k3artifacts.stores.registry import open_store
    from k3artifacts.stores.verify import verify_revision
    store = open_store(store_url)
    t = time.perf_counter()
    report = verify_revision(store=store, repo_id=repo, commit=commit, full=what == "full")
    seconds = time.perf_counter() - t
    assert report.ok, report.problems
else:  # threads|processes:<algorithm>: hash_files alone over the revision's files
    from k3artifacts.revisions.parallel import FileToHash, hash_files
    mode, algorithm = what.split(":")
    paths = sys.argv[5:]
    files = [FileToHash(p, os.path.getsize(p), lambda p=p: os.open(p, os.O_RDONLY))
             for p in paths]
    t = time.perf_counter()
    results = hash_files(files, algorithm, processes=mode == "processes")
    seconds = time.perf_counter() - t
    assert all(r.digest for r in results.values())
print(json.dumps({"seconds": seconds}))
"""


def _shares(paths: list[str], n: int) -> list[list[str]]:
    """Largest first to the least loaded of ``n`` processes."""
    shares: list[list[str]] = [[] for _ in range(n)]
    loads = [0] * n
    for path in sorted(paths, key=os.path.getsize, reverse=True):
        i = loads.index(min(loads))
        shares[i].append(path)
        loads[i] += os.path.getsize(path)
    return [s for s in shares if s]


def _stats(values: list[float]) -> tuple[float, float]:
    return min(values), statistics.median(values)


def verify(bench: Bench, opts: Options, shared: dict) -> list[Row]:
    if "file_store" not in shared:
        with bench.hub() as endpoint:
            _, commit, blobs = published_release(bench, opts)
            store = bench.fresh("store-file")
            bench.settle(blobs)
            result, _ = stage_child(bench, endpoint, f"file://{store}", workers=opts.workers)
            shared["file_store"] = (store, commit, result)
    store, commit, _ = shared["file_store"]
    url = f"file://{store}"
    revision_dir = store / "models" / REPO / commit
    paths = sorted(str(p) for p in revision_dir.rglob("*") if p.is_file() and ".k3a" not in p.parts)
    total = sum(os.path.getsize(p) for p in paths)
    cores = len(os.sched_getaffinity(0))
    shares = json.dumps(_shares(paths, cores))
    cache = bench.fresh("node-cache")
    manifest_digest = json.loads(bench.k3a("pull", f"{REPO}@{commit}", "--store", url, "--to",
                                           str(cache), "--json", "-q").stdout)["manifest_digest"]
    pulled = [str(p) for p in (cache / "models" / REPO / commit).rglob("*")
              if p.is_file() and ".k3a" not in p.parts]

    times: dict[str, list[float]] = {}

    def timed(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    for _ in range(opts.verify_runs):  # sides alternate: the machine is shared
        for algorithm, mode in (("xxh3-128", "fast"), ("sha256", "full")):
            bench.settle([Path(p) for p in paths])
            limit = bench.python(_LIMIT_RUNNER, algorithm, _LIMIT_CHILD, shares).json()
            timed(f"limit {algorithm}", limit["seconds"])
            timed(f"limit {algorithm} whole", limit["whole"])
            bench.settle([Path(p) for p in paths])
            child = bench.python(_OURS_CHILD, mode, url, REPO, commit)
            timed(f"verify {mode}", child.json()["seconds"])
            for how in ("threads", "processes"):
                bench.settle([Path(p) for p in paths])
                timed(f"{how} {algorithm}", bench.python(
                    _OURS_CHILD, f"{how}:{algorithm}", url, REPO, commit, *paths
                ).json()["seconds"])
        bench.settle([Path(p) for p in pulled])
        again = bench.k3a("pull", f"{REPO}@{commit}", "--store", url, "--to", str(cache),
                          "--json", "-q")
        result = again.json()
        assert result["already_present"] and result["bytes_rehashed"] == total, result
        timed("re-pull", result["seconds"])
        timed("re-pull process", again.seconds)
        bench.settle([Path(p) for p in pulled])
        started = time.perf_counter()
        bench.k3a("pull", f"{REPO}@{commit}", "--store", url, "--to", str(cache), "-q")
        bench.k3a("verify", str(cache / "models" / REPO / commit), "--expect-digest",
                  manifest_digest, "-q")
        timed("pod start", time.perf_counter() - started)
    return _rows(times, total, len(paths), cores, bench)


def _rows(times: dict[str, list[float]], total: int, files: int, cores: int,
          bench: Bench) -> list[Row]:
    from k3artifacts import settings
    from k3artifacts.revisions.parallel import in_processes

    def chosen(algorithm: str) -> str:
        """Where k3a's own hashing ran in this run: ``K3A_HASH_IN``, else its rule."""
        forced = settings.load().hash_in
        if forced is not None:
            return f"{forced} (K3A_HASH_IN)"
        return "processes" if in_processes(algorithm, min(files, cores), total) else "threads"

    def rate(name: str) -> tuple[float, float]:
        best, median = _stats(times[name])
        return total / best / MB, total / median / MB

    common = (f"{total / 2**30:.2f} GiB in {files} files, {cores} cores; best of "
              f"{len(times['re-pull'])} alternating rounds (median in the note); "
              f"{cache_note(bench)}")
    rows = []
    for label, ours, limit, target in (
            ("4 k3a verify (xxh3-128)", "verify fast", "limit xxh3-128", 0.9),
            ("4 k3a verify --full (sha256)", "verify full", "limit sha256", 0.9),
            ("4 re-pull of an unchanged revision (re-hashes)", "re-pull", "limit xxh3-128",
             0.8)):
        (best, median), (lbest, lmedian) = rate(ours), rate(limit)
        algorithm = limit.split()[1]
        rows.append(Row(
            label, best, "MB/s", f"one {algorithm} process per core", lbest, best / lbest,
            f">= {target}", best / lbest >= target,
            note=f"{common}; median {median:,.0f} vs {lmedian:,.0f} MB/s "
                 f"({median / lmedian:.3f}); k3a hashed in {chosen(algorithm)}; the limit: "
                 f"{cores} `python -c` processes over "
                 "disjoint files, from the moment all had started to the last exit (with "
                 f"their starts: best {total / min(times[limit + ' whole']) / MB:,.0f} MB/s)",
            extra={"seconds": times[ours], "limit_seconds": times[limit]}))
    rows[2].note += (f"; the pull's own time (lock, store manifest, hash); whole `k3a pull` "
                     f"process best {min(times['re-pull process']):.2f} s")
    pod_best, pod_median = _stats(times["pod start"])
    one_pass = min(times["limit xxh3-128"])
    rows.append(Row(
        "4 pod start to verified, revision on the node", pod_best, "s",
        "one xxh3 pass at the limit", one_pass, one_pass / pod_best, "", None,
        note=f"`k3a pull` (re-hashes) then `k3a verify DIR --expect-digest` (hashes again), "
             f"two whole processes as the rendered init containers run them; median "
             f"{pod_median:.2f} s",
        extra={"seconds": times["pod start"]}))
    for algorithm in ("xxh3-128", "sha256"):
        (tb, tm), (pb, pm) = rate(f"threads {algorithm}"), rate(f"processes {algorithm}")
        rows.append(Row(
            f"4 hash_files {algorithm}: threads vs processes", tb, "MB/s",
            f"{cores} hashing processes", pb, tb / pb, "", None,
            note=f"same files, library call; medians {tm:,.0f} vs {pm:,.0f} MB/s; k3a uses "
                 f"{chosen(algorithm)} here",
            extra={"threads_seconds": times[f"threads {algorithm}"],
                   "processes_seconds": times[f"processes {algorithm}"]}))
    return rows

