"""Traffic analysis of canary steps against a real Prometheus (Debian's package) scraping two
OpenAI-compatible test servers that export vLLM's metrics: one within the channel's bounds and
one that degrades (slow first token, 5xx answers). `k3a traffic analyze` passes the first and
fails the second, records both, and the `traffic` gate follows."""

from __future__ import annotations

import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
import urllib3
import yaml

from k3artifacts.policy.rollout import TrafficPolicy
from k3artifacts.releases.analyses import list_analyses
from k3artifacts.serving.render import render
from k3artifacts.serving.render.common import served_name
from k3artifacts.stores.file import FileStore
from k3artifacts.traffic.prometheus import Prometheus
from tests.fixtures.moves import check_gate, promote, use_policy
from tests.fixtures.prometheus import prometheus, prometheus_binary
from tests.support.openai_server import start
from tests.support.releases import Releases

pytestmark = pytest.mark.slow

REQUESTS = 40
TRAFFIC = {
    "steps": [{"weight": 1, "pause": "1s", "cohort": "internal"}, {"weight": 100, "pause": "1s"}],
    "window": "1m",
    "prometheus": "http://prometheus.monitoring.svc:9090",
    "thresholds": {"quantile": 0.99, "max_e2e_s": 2.0, "max_ttft_s": 0.2,
                   "max_error_rate": 0.05, "min_requests": 10},
}


def _drive(url: str, model: str, requests: int = REQUESTS) -> tuple[int, int]:
    """``requests`` chat completions, four at a time; (answered 200, answered 5xx)."""
    http = urllib3.PoolManager(maxsize=4, retries=False, timeout=30)
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Reply with exactly: ok"}]})

    def one(_: int) -> int:
        return http.request("POST", f"{url}/chat/completions", body=body,
                            headers={"Content-Type": "application/json"}).status

    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(one, range(requests)))
    return statuses.count(200), sum(1 for s in statuses if s >= 500)


def test_analysis_passes_the_good_canary_and_fails_the_degrading_one(
    tmp_path: Path, policies: Path, k3a_cmd, k3a_env
):
    prometheus_binary()
    gate_file = policies / "promotion-gates.yaml"
    gate_policy = yaml.safe_load(gate_file.read_text())
    gate_policy["channels"]["production"]["traffic"] = TRAFFIC
    gate_file.write_text(yaml.safe_dump(gate_policy))
    store = FileStore(tmp_path / "store")
    use_policy(store, policies)
    rel = Releases(store, tmp_path / "scratch")
    good, bad = rel.release(), rel.release()
    model = served_name(good)
    servers = {
        good.id: start(model, tmp_path / "good.log", token_delay=0.01),
        bad.id: start(model, tmp_path / "bad.log", token_delay=0.01, slow_first_token=0.4,
                      error_rate=0.25),
    }
    try:
        targets = {f"127.0.0.1:{s.port}": {"k3a_io_tuple_id": t} for t, s in servers.items()}
        with prometheus(tmp_path / "prometheus", targets) as prom:
            def judged(release):
                return check_gate(store, release, "production", "traffic")

            before = judged(good)
            assert not before.passed
            assert "no analysis under the current bounds of step 0 (1%), 1 (100%)" in before.reason

            # A first request each, scraped before the load: a counter series is born with its
            # first request, and a rate needs two samples of it inside the window.
            for tuple_id, server in servers.items():
                assert _drive(server.url, model, 1) == (1, 0)
                prom.wait_for(f'sum(http_requests_total{{k3a_io_tuple_id="{tuple_id}"}})',
                              lambda r: bool(r), f"the first request of {tuple_id}")
            answered = {t: _drive(s.url, model) for t, s in servers.items()}
            assert answered[good.id] == (REQUESTS, 0)
            ok_bad, errors_bad = answered[bad.id]
            assert errors_bad == REQUESTS // 4 and ok_bad == REQUESTS - errors_bad
            # Wait (bounded) until Prometheus has scraped every answer of both servers.
            for tuple_id, (ok, _) in answered.items():
                prom.wait_for(f'vllm:e2e_request_latency_seconds_count{{k3a_io_tuple_id='
                              f'"{tuple_id}"}}',
                              lambda r, n=ok: bool(r) and float(r[0]["value"][1]) == n + 1,
                              f"{ok + 1} finished requests of {tuple_id}")
                prom.wait_for(f'sum(http_requests_total{{k3a_io_tuple_id="{tuple_id}"}})',
                              lambda r: bool(r) and float(r[0]["value"][1]) == REQUESTS + 1,
                              f"{REQUESTS + 1} HTTP answers of {tuple_id}")

            def analyze(release, step):
                return subprocess.run(
                    [*k3a_cmd, "traffic", "analyze", release.id, "--prometheus", prom.url,
                     "--channel", "production", "--step", str(step), "--json",
                     "--store", store.url],
                    env=k3a_env, capture_output=True, text=True, timeout=120)

            for step in (0, 1):
                run = analyze(good, step)
                assert run.returncode == 0, run.stderr + run.stdout
                out = json.loads(run.stdout)
                assert out["passed"] and out["written"]
                values = {m["name"]: m["value"] for m in out["analysis"]["metrics"]}
                assert values["requests"] >= 10 and values["error_rate"] == 0
                assert values["time_to_first_token"] <= 0.2

            run = analyze(bad, 0)
            assert run.returncode == 5, run.stderr + run.stdout
            out = json.loads(run.stdout)
            failed = {m["name"]: m["value"] for m in out["analysis"]["metrics"]
                      if not m["passed"]}
            assert set(failed) == {"time_to_first_token", "error_rate"}
            assert failed["time_to_first_token"] > 0.25 and failed["error_rate"] > 0.05
            human = analyze(bad, 1)
            assert human.returncode == 5
    finally:
        for server in servers.values():
            server.stop()

    # Evidence: create-once records beside each tuple; the gate follows them.
    assert [r.analysis.step for r in list_analyses(store, good.id, "production")] == [0, 1]
    assert judged(good).passed
    verdict = judged(bad)
    assert not verdict.passed
    assert "step 0 (1%)" in verdict.reason and "time_to_first_token" in verdict.reason
    assert "step 1 (100%)" in verdict.reason


def _argo_condition(condition: str, result: list[float]) -> bool:
    """An AnalysisTemplate's successCondition as Argo Rollouts evaluates it (expr-lang), for
    the few operators the rendered ones use."""
    python = (condition.replace("&&", " and ").replace("||", " or ").replace("!isNaN", "not isNaN"))
    return bool(eval(python, {"__builtins__": {}}, {  # noqa: S307 - our own rendered text
        "len": len, "isNaN": math.isnan, "result": result}))


#: A shift must exceed 20 ms to fail: p99 of a 40-request histogram moves by a few ms
#: between two equal servers on a loaded machine, and the slower canary is 50 ms late.
COMPARED_TRAFFIC = {**TRAFFIC, "against_stable": {"floor_ms": 20}}


def test_a_canary_slower_than_the_stable_pods_fails_under_the_bounds(
    tmp_path: Path, policies: Path, k3a_cmd, k3a_env
):
    """Stable, an equal canary and a canary whose first token is 50 ms late (well under the
    200 ms bound): the same window of each, compared by vLLM's TTFT and e2e histograms, by
    `k3a traffic analyze` and by the rendered AnalysisTemplate's own queries."""
    prometheus_binary()
    gate_file = policies / "promotion-gates.yaml"
    gate_policy = yaml.safe_load(gate_file.read_text())
    production = gate_policy["channels"]["production"]
    production.update(gates=["artifact"], traffic=COMPARED_TRAFFIC)
    gate_file.write_text(yaml.safe_dump(gate_policy))
    store = FileStore(tmp_path / "store")
    rel = Releases(store, tmp_path / "scratch")
    stable, equal, slower = rel.release(), rel.release(), rel.release()
    promote(store, stable.id, "production", actor="alice", policies_dir=policies)
    model = served_name(stable)
    servers = {
        stable.id: start(model, tmp_path / "stable.log", token_delay=0.01),
        equal.id: start(model, tmp_path / "equal.log", token_delay=0.01),
        slower.id: start(model, tmp_path / "slower.log", token_delay=0.01,
                         slow_first_token=0.05),
    }
    try:
        # Each server as the pods of one ReplicaSet of the Rollout: the tuple's label, and the
        # pod-template hash the controller adds.
        hashes = {t: f"{i}7d9f8c6b5" for i, t in enumerate(servers)}
        targets = {f"127.0.0.1:{s.port}": {"k3a_io_tuple_id": t,
                                           "rollouts_pod_template_hash": hashes[t]}
                   for t, s in servers.items()}
        with prometheus(tmp_path / "prometheus", targets) as prom:
            for tuple_id, server in servers.items():
                assert _drive(server.url, model, 1) == (1, 0)
                prom.wait_for(f'sum(http_requests_total{{k3a_io_tuple_id="{tuple_id}"}})',
                              lambda r: bool(r), f"the first request of {tuple_id}")
            for server in servers.values():
                assert _drive(server.url, model) == (REQUESTS, 0)
            for tuple_id in servers:
                prom.wait_for(f'vllm:time_to_first_token_seconds_count{{k3a_io_tuple_id='
                              f'"{tuple_id}"}}',
                              lambda r: bool(r) and float(r[0]["value"][1]) == REQUESTS + 1,
                              f"{REQUESTS + 1} first tokens of {tuple_id}")

            def analyze(release, step=0):
                run = subprocess.run(
                    [*k3a_cmd, "traffic", "analyze", release.id, "--prometheus", prom.url,
                     "--channel", "production", "--step", str(step), "--json",
                     "--store", store.url],
                    env=k3a_env, capture_output=True, text=True, timeout=120)
                return run.returncode, json.loads(run.stdout), run.stderr

            def rendered_comparison(canary, canary_hash=None) -> dict[str, tuple[float | None,
                                                                                  bool]]:
                """The rendered AnalysisTemplate's comparison metrics, their arguments as the
                controller fills them in, asked of Prometheus now: name -> (value, passed)."""
                docs = render(canary, "eks-rollout",
                              traffic=TrafficPolicy.model_validate(COMPARED_TRAFFIC)).documents
                template = next(d for d in docs if d["kind"] == "AnalysisTemplate"
                                and d["metadata"]["name"].endswith("-against-stable"))
                out = {}
                for metric in template["spec"]["metrics"]:
                    promql = (metric["provider"]["prometheus"]["query"]
                              .replace("{{args.canary-hash}}", canary_hash or hashes[canary.id])
                              .replace("{{args.stable-hash}}", hashes[stable.id]))
                    value = Prometheus(prom.url).value(promql, datetime.now(UTC))
                    result = [math.nan if value is None else value]
                    out[metric["name"]] = (value, _argo_condition(metric["successCondition"],
                                                                  result))
                return out

            same = rendered_comparison(equal)
            assert all(passed for _, passed in same.values()), same
            late = rendered_comparison(slower)
            ttft_value, ttft_passed = late["time-to-first-token-against-stable"]
            assert ttft_value is not None and ttft_value > 1 and not ttft_passed, late
            # pods that finished no request in the window: inconclusive, which fails by default
            unseen = rendered_comparison(equal, canary_hash="0000000000")
            assert all(v is None and not passed for v, passed in unseen.values()), unseen

            code, out, err = analyze(equal)
            assert code == 0, err
            assert all(m["passed"] for m in out["analysis"]["metrics"])
            compared = {c["name"]: c for c in out["analysis"]["against_stable"]}
            assert set(compared) == {"e2e_latency", "time_to_first_token"}
            assert compared["time_to_first_token"]["stable_tuple_id"] == stable.id
            assert all(c["judgement"]["outcome"] == "pass" for c in compared.values())

            # At 100% the stable pods get no traffic: that step is judged by its bounds.
            code, out, err = analyze(equal, step=1)
            assert code == 0, err
            assert out["analysis"]["against_stable"] == []

            code, out, err = analyze(slower)
            assert code == 5, err
            # Every absolute bound holds: only the comparison with the stable pods fails.
            assert all(m["passed"] for m in out["analysis"]["metrics"])
            ttft = next(c for c in out["analysis"]["against_stable"]
                        if c["name"] == "time_to_first_token")
            assert ttft["judgement"]["outcome"] == "fail", ttft["judgement"]["reason"]
            assert ttft["judgement"]["n_candidate"] >= REQUESTS
            assert sum(count for _, count in ttft["stable"]) >= REQUESTS
    finally:
        for server in servers.values():
            server.stop()
    passed = check_gate(store, equal, "production", "traffic")
    assert passed.passed, passed.reason
    assert f"1% (not slower than {stable.id})" in passed.reason
    verdict = check_gate(store, slower, "production", "traffic")
    assert not verdict.passed
    assert "time_to_first_token against the stable pods" in verdict.reason
    assert "slower beyond tolerance" in verdict.reason
