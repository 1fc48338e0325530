"""Issue 36's floor: the one-shard commit of the headline, in rounds, so that a fixed cost of a
few tenths of a second is told from a shared machine's noise.

Setup, untimed: one SeaweedFS, the local hub, the full revision staged (signed) by each side
and pulled onto its ``--nodes`` node caches. Then ``--floor-runs`` rounds; each round publishes
a new upstream commit changing one shard (its last 4 KiB, fresh random bytes) and runs every
side on it, in an order that rotates from round to round:

* k3a: ``k3a stage --signing-key`` (stage + sign), then ``k3a pull`` onto each node (which
  holds the previous commits, as a node would);
* the peer: ``hf download``, ``s5cmd sync`` up, ``s5cmd sync`` down to each node, then
  ``sync``;
* with ``--baseline-code DIR``, k3a again from another checkout (``PYTHONPATH=DIR``: the code
  before a change, e.g. ``git archive <commit> | tar -x -C DIR``), into its own store and
  nodes, so before and after are measured in the same rounds.

Every step is one whole process timed from its start to its exit, the same way for every
side (``Bench.run``), k3a's modules compiled to bytecode first, as an installed package's are
(the peer's tools are installed, so theirs are): where ``PYTHONDONTWRITEBYTECODE`` is set, as
on the 2-core VM, a checkout's k3a compiled every module it imported in every process. The
figure is each side's median commit (and its fastest), each step's median beside it.

    python -m bench --only floor --size 64MiB --shards 16 --nodes 2 --floor-runs 5

Target (issue 36, the 16-core machine): the one-shard commit at 64 MiB within 1.2 s.
"""

from __future__ import annotations

import compileall
import os
import statistics
from pathlib import Path

from tests.support.seaweed import SeaweedS3

from .env import REPO_ROOT, Bench, Row
from .headline import REPO, Leg, _changed_shard, _Sides
from .staging import Options
from .tools import hf_argv

FLOOR_TARGET_S = 1.2


def _median_steps(legs: list[Leg]) -> dict[str, float]:
    return {name: statistics.median(leg.steps[name] for leg in legs) for name in legs[0].steps}


def _describe(legs: list[Leg]) -> str:
    totals = sorted(leg.seconds for leg in legs)
    steps = ", ".join(f"{name} {s:.2f}" for name, s in _median_steps(legs).items())
    return (f"median {statistics.median(totals):.2f} s, min {totals[0]:.2f}, max "
            f"{totals[-1]:.2f} over {len(legs)} rounds (median steps: {steps})")


def floor(bench: Bench, opts: Options, shared: dict) -> list[Row]:
    files = bench.release(opts.size, opts.shards, seed=22)
    weights = sorted(p for p in files if p.endswith(".safetensors"))
    changed_name = weights[len(weights) // 2]
    first = bench.publish_on_hub(REPO, files)
    total = sum(p.stat().st_size for p in files.values())
    hf = hf_argv()
    if hf is None:
        raise RuntimeError("the floor needs the peer's `hf` command (huggingface_hub)")
    for code in (REPO_ROOT, opts.baseline_code):
        if code is not None:
            compileall.compile_dir(Path(code) / "k3artifacts", quiet=1)
    with SeaweedS3(bench.fresh("seaweedfs-floor")) as server, bench.hub() as hub:
        sides: dict[str, _Sides] = {"k3a": _Sides(bench, opts, hub, server, hf)}
        if opts.baseline_code is not None:
            baseline = _Sides(bench, opts, hub, server, hf)
            # `python -m` puts the working directory (this checkout) first on sys.path;
            # PYTHONSAFEPATH leaves it out, so PYTHONPATH alone says whose k3a runs.
            baseline.env.update(PYTHONPATH=str(Path(opts.baseline_code).resolve()),
                                PYTHONSAFEPATH="1")
            sides["k3a (baseline code)"] = baseline
        runners = {name: side.k3a for name, side in sides.items()}
        runners["peer"] = sides["k3a"].peer
        bench.log("floor: the full revision, every side (untimed)")
        for run in runners.values():
            run(first)
        legs: dict[str, list[Leg]] = {name: [] for name in runners}
        names = list(runners)
        for i in range(opts.floor_runs):
            second = dict(files)
            second[changed_name] = _changed_shard(
                files[changed_name], bench.fresh(f"floor-rev{i}") / "shard.safetensors")
            commit = bench.publish_on_hub(REPO, second)
            bench.settle(bench.blob_paths(REPO, commit))
            order = names[i % len(names):] + names[: i % len(names)]
            for name in order:
                bench.log(f"floor: round {i + 1}, {name}")
                leg = runners[name](commit)
                legs[name].append(leg[0] if isinstance(leg, tuple) else leg)
    cores = len(os.sched_getaffinity(0))
    where = (f"{cores} cores, load {os.getloadavg()[0]:.1f} at the end, "
             f"{total / 2**20:.0f} MiB in {len(weights)} shards, {opts.nodes} nodes")
    peer = statistics.median(leg.seconds for leg in legs["peer"])
    rows = []
    for name in names:
        median = statistics.median(leg.seconds for leg in legs[name])
        is_peer = name == "peer"
        rows.append(Row(
            f"36 one-shard commit floor: {name}", median, "s",
            "" if is_peer else "peer (median)", None if is_peer else peer,
            None if is_peer else peer / median,
            "" if is_peer else f"<= {FLOOR_TARGET_S} s on 16 cores",
            None if is_peer or cores < 16 else median <= FLOOR_TARGET_S,
            note=f"{where}; {_describe(legs[name])}",
            extra={"rounds": [leg.steps for leg in legs[name]]},
        ))
    return rows
