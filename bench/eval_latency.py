"""Issue 40: the evaluation's latency judge (``k3artifacts/judging``) at the packaged
defaults, against the test server (``tests/support/openai_server.py``) with 0-5 ms of random
jitter on every request, unchanged, 30% slower and 3x slower (``--slowdown``), and the wall
time of one default ``k3a eval run``.

    python -m bench --only eval-latency [--eval-first-token-ms 100]

What runs: one tuple in a scratch file store; three server processes serving it, each with
``--jitter-ms 0-5`` (one also ``--slowdown 1.3``, one ``--slowdown 3``). Each "eval run" of
the rates is the sampling an eval run does (:func:`k3artifacts.readiness.latency.sample_latency`,
the same client, request, sample size and retry rounds), judged at the defaults of
``evaluation.latency_regression``: the rest of an eval run (the suite's cases, the sweep) does
not touch the samples, and 61 whole runs would take 16 minutes here. False regressions: 21 runs
against the unchanged server, each of the last 20 judged against the one before. Real
regressions: 20 times, a run of the unchanged server, then one of the slowed server judged
against it. "Detected" is what the gate would refuse: a ``fail``, or an ``inconclusive`` left
after the retry rounds (counted as ``fail`` by default). Then one whole ``k3a eval run`` of the
packaged k3-core suite against the unchanged server, timed as a process.

Targets: 0 of 20 false regressions; the 30% slowdown detected in >= 19 of 20; 3x in 20 of 20;
the whole eval under 2 minutes on the 2-core machine.

The server as it is answers in about 10 ms, most of it CPU (the client's and the server's
Python): on a machine whose other work swings, run-to-run drift of that CPU time moves the
median by more than a 30% slowdown does. ``--eval-first-token-ms`` gives the server a fixed
first-token delay (a sleep: no CPU), the shape of a real endpoint's latency, so the figure
measures the judge rather than the neighbours.
"""

from __future__ import annotations

import os
import statistics
import sys

from k3artifacts.judging.compare import Judgement
from k3artifacts.policy.model import LatencyRegressionPolicy
from k3artifacts.readiness.client import make_client
from k3artifacts.readiness.latency import Sampling, sample_latency
from k3artifacts.readiness.suite import SmokeSettings
from k3artifacts.releases.evaluations import Baseline, LatencySamples
from k3artifacts.serving.render.common import served_names
from k3artifacts.stores.file import FileStore
from tests.support.openai_server import FixtureServer, start
from tests.support.releases import Releases

from .env import Bench, Row
from .staging import Options

RUNS = 20
JITTER = "0-5"
SLOWDOWNS = (1.3, 3.0)
EVAL_TARGET_S = 120.0


def _baseline(samples: LatencySamples, tuple_id: str, policy: LatencyRegressionPolicy) -> Baseline:
    return Baseline(channel="bench", tuple_id=tuple_id, report_sha256="0" * 64, pass_rate=1.0,
                    e2e_p99=None, e2e_samples=samples.e2e, criteria=policy.criteria())


class _Endpoint:
    """One server, sampled as an eval run samples it."""

    def __init__(self, server: FixtureServer, model: str, policy: LatencyRegressionPolicy):
        settings = SmokeSettings()
        self.client = make_client(server.url, settings, retries=0)
        self.model, self.policy = model, policy
        self.max_tokens = settings.sweep.max_tokens
        self.sampling = Sampling(policy.min_samples, policy.max_samples)

    def run(self, against: LatencySamples | None) -> tuple[LatencySamples, Judgement | None]:
        base = None if against is None else _baseline(against, self.model, self.policy)
        return sample_latency(self.client, self.model, self.max_tokens, self.sampling, base)


def _tally(verdicts: list[Judgement]) -> str:
    counts = {o: sum(1 for v in verdicts if v.outcome == o)
              for o in ("pass", "fail", "inconclusive")}
    shifts = [v.shift_ms for v in verdicts if v.shift_ms is not None]
    samples = sorted(v.n_candidate for v in verdicts)
    return (f"{counts['pass']} pass, {counts['fail']} fail, {counts['inconclusive']} "
            f"inconclusive; shift median {statistics.median(shifts):+.2f} ms (range "
            f"{min(shifts):+.2f} to {max(shifts):+.2f}); candidate samples {samples[0]}-"
            f"{samples[-1]}")


def _judged(endpoint: _Endpoint, against: _Endpoint) -> list[Judgement]:
    """``RUNS`` runs of ``endpoint``, each judged against a run of ``against`` just before it
    (``against`` is ``endpoint``: each against the previous)."""
    verdicts = []
    previous, _ = against.run(None)
    for _ in range(RUNS):
        if against is not endpoint:
            previous, _ = against.run(None)
        current, verdict = endpoint.run(previous)
        assert verdict is not None
        verdicts.append(verdict)
        previous = current
    return verdicts


def _whole_eval(bench: Bench, store: FileStore, url: str, tuple_id: str) -> float:
    home = bench.fresh("eval-home")
    env = {**bench.env, "HOME": str(home), "K3A_STORE": store.url}
    child = bench.k3a("eval", "run", url, "--tuple", tuple_id, "--channel", "production",
                      env=env)
    return child.seconds


def eval_latency(bench: Bench, opts: Options, shared: dict) -> list[Row]:
    work = bench.fresh("eval-latency")
    store = FileStore(work / "store")
    release = Releases(store, work / "scratch").release()
    policy = LatencyRegressionPolicy()
    load = os.getloadavg()[0]
    first = opts.eval_first_token_ms / 1000
    servers = [start(served_names(release), work / f"server-{f}.log", jitter_ms=JITTER,
                     slowdown=f, slow_first_token=first) for f in (1.0, *SLOWDOWNS)]
    try:
        same, *slowed = (_Endpoint(s, release.id, policy) for s in servers)
        bench.log("eval-latency: false regressions")
        unchanged = _judged(same, same)
        rows = [Row(f"eval latency: false regressions, {RUNS} runs, {JITTER} ms jitter",
                    sum(1 for v in unchanged if not v.passed), f"of {RUNS}",
                    target="0", passed=all(v.passed for v in unchanged),
                    note=_tally(unchanged))]
        for factor, endpoint in zip(SLOWDOWNS, slowed, strict=True):
            bench.log(f"eval-latency: slowdown {factor}")
            verdicts = _judged(endpoint, same)
            found = sum(1 for v in verdicts if not v.passed)
            want = RUNS if factor >= 2 else RUNS - 1
            rows.append(Row(f"eval latency: {factor:g}x slower detected", found, f"of {RUNS}",
                            target=f">= {want}", passed=found >= want, note=_tally(verdicts)))
        bench.log("eval-latency: one whole k3a eval run")
        seconds = _whole_eval(bench, store, servers[0].url, release.id)
    finally:
        for server in servers:
            server.stop()
    rows.append(Row("one default k3a eval run (k3-core, test server)", seconds, "s",
                    target=f"< {EVAL_TARGET_S:g} s", passed=seconds < EVAL_TARGET_S,
                    note=f"first token held {opts.eval_first_token_ms:g} ms + {JITTER} ms "
                         f"jitter; {policy.min_samples} latency samples a run (more only while "
                         f"inconclusive, up to {policy.max_samples}); load average "
                         f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
                         f"{os.cpu_count()} cores; Python {sys.version.split()[0]}"))
    return rows
