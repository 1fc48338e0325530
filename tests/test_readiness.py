"""Readiness runs against a real HTTP server process on loopback (the OpenAI-compatible fixture
server, `tests/support/openai_server.py`) through the official `openai` client, and the
evaluation gate judging the reports they leave in the store."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from k3artifacts.errors import GateFailed, UntrustedRecord
from k3artifacts.readiness.markdown import report_markdown
from k3artifacts.readiness.record import evaluate
from k3artifacts.readiness.sweep import knee, percentile
from k3artifacts.releases.evaluations import (
    EvaluationRecord,
    SweepPoint,
    evaluations_prefix,
    list_evaluations,
    record_run,
)
from k3artifacts.serving.render.common import served_name, served_names
from k3artifacts.stores.file import FileStore
from tests.fixtures.moves import check_gates, promote, use_policy
from tests.fixtures.people import person
from tests.fixtures.releases import REPO_ROOT, staged_for
from tests.support.cli import invoke
from tests.support.openai_server import start
from tests.support.ports import free_ports
from tests.support.releases import Releases

SUITE = "eval-suites/k3-core.yaml"


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    # Readiness does not depend on the store backend beyond create-once records, which the
    # store-generic tests cover on S3; the file store keeps these tests fast.
    return FileStore(tmp_path / "store")


@pytest.fixture
def fast_policies(policies: Path) -> Path:
    """The checkout's policy and suite, with SLOs and a sweep small enough for a test."""
    path = policies / SUITE
    suite = yaml.safe_load(path.read_text())
    suite["smoke"] = {"request_timeout_s": 5, "max_retries": 1,
                      "slo": {"ttft_p99_s": 0.5, "e2e_p99_s": 2.0, "max_error_rate": 0.01},
                      "sweep": {"max_concurrency": 4, "requests_per_worker": 2, "max_tokens": 16}}
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return policies


@pytest.fixture
def server(tmp_path: Path):
    """Start fixture servers (stopped by PID at teardown): server(name, **faults)."""
    started = []

    def run(names: str | list[str], **faults):
        s = start(names, tmp_path / f"openai-{len(started)}.log", **faults)
        started.append(s)
        return s

    yield run
    for s in started:
        s.stop()


def _gate(store, release, policies):
    report = check_gates(store, release.id, "production", policies_dir=policies)
    return next(r for r in report.results if r.name == "evaluation")


def test_fixture_server_speaks_the_wire_protocol(server):
    s = server("kimi-k3")
    models = json.load(urllib.request.urlopen(f"{s.url}/models", timeout=5))
    assert [m["id"] for m in models["data"]] == ["kimi-k3"]
    body = json.dumps({"model": "kimi-k3", "stream": True, "max_tokens": 3,
                       "messages": [{"role": "user", "content": "one two three four"}]})
    req = urllib.request.Request(f"{s.url}/chat/completions", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        assert resp.headers["Transfer-Encoding"] == "chunked"
        events = [line for line in resp.read().decode().split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).split() == [
        "Echo", "from", "the"]


def test_a_passing_run_lets_production_gate_pass(store, tmp_path, fast_policies, server,
                                                 reviewed):
    release = Releases(store, tmp_path / "scratch").release()
    reviewed(release)
    s = server(served_names(release))
    outcome = evaluate(store, s.url, release.id, fast_policies / SUITE, channel="production",
                       by=person("ci"))
    report = outcome.report
    assert report.passed and outcome.written, report.failed
    assert [c.name for c in report.checks] == [
        "models", "loaded", "chat", "stream", "structured_output", "tool_call", "long_context",
        "sweep"]
    loaded = next(c for c in report.checks if c.name == "loaded")
    assert loaded.detail == ("loaded /opt/ml/model, the tuple's model path (where a render "
                             "mounts its revision); max_model_len 8192 (the profile leaves "
                             "vLLM's default)")
    assert report.code_sandbox is not None and "uid 65534" in report.code_sandbox
    assert report.served_models == served_names(release) and report.pass_rate == 1.0
    assert report.sweep is not None and [p.concurrency for p in report.sweep.points] == [1, 2, 4]
    long_context = next(c for c in report.checks if c.name == "long_context")
    assert "target 7680" in long_context.detail  # the server's 8192 less room for the answer
    (stored,) = list_evaluations(store, release.id)
    assert stored.origin == "run" and stored.readiness() == report
    gate = _gate(store, release, fast_policies)
    assert gate.passed, gate.reason
    assert "k3-core: 11/11 = 100.0% >= 95.0%" in gate.reason
    staged_for(store, release, fast_policies)  # production comes after staging
    assert promote(store, release.id, "production", actor="alice",
                   policies_dir=fast_policies).changed
    md = report_markdown(report)
    assert "| tool_call | pass |" in md and "Latency against concurrency" in md


FAULTS = [
    pytest.param({"slow_first_token": 0.6}, {"stream", "sweep"}, "first token after",
                 id="slow-first-token"),
    pytest.param({"rate_limit": 1.0}, {"chat", "stream", "structured_output", "tool_call",
                                       "long_context", "sweep", "exact-token"},
                 "rate limited: HTTP 429 after 2 attempt(s)", id="429s"),
    pytest.param({"malformed_json": True}, {"structured_output", "tool_call",
                                            "structured-invoice", "tool-weather"},
                 "malformed JSON", id="malformed-json"),
    pytest.param({"served_names": "someone-else"}, {"models", "chat"},
                 "serves ['someone-else'] and no tuple id", id="wrong-served-name"),
    pytest.param(None, {"models", "chat", "sweep", "tool-weather"}, "connection refused",
                 id="connection-refused"),
]


@pytest.mark.parametrize(("faults", "failing", "detail"), FAULTS)
def test_each_failure_mode_names_its_check_and_the_gate_refuses_the_report(
    store, tmp_path, fast_policies, server, reviewed, faults, failing, detail
):
    release = Releases(store, tmp_path / "scratch").release()
    reviewed(release)
    if faults is None:
        (port,) = free_ports(1)  # nobody listens there
        url = f"http://127.0.0.1:{port}"
    else:
        name = faults.pop("served_names", served_names(release))
        url = server(name, **faults).url
    began = time.monotonic()
    outcome = evaluate(store, url, release.id, fast_policies / SUITE, channel="production",
                       by=person("ci"))
    report = outcome.report
    failed = {c.name for c in report.failed}
    assert failing <= failed, (failing - failed, report.failed)
    assert any(detail in c.detail for c in report.failed), [c.detail for c in report.failed]
    assert not report.passed and outcome.written
    assert report.unreachable == (faults is None)
    if faults is None:
        assert time.monotonic() - began < 10  # a dead endpoint fails fast
    gate = _gate(store, release, fast_policies)
    assert not gate.passed
    first_check = next(c.name for c in report.checks if not c.passed)
    assert f"check {first_check} failed" in gate.reason or "below the required" in gate.reason
    with pytest.raises(GateFailed):
        promote(store, release.id, "production", actor="alice", policies_dir=fast_policies)


def test_reports_for_another_tuple_or_suite_are_refused(store, tmp_path, fast_policies,
                                                        server, reviewed):
    releases = Releases(store, tmp_path / "scratch")
    ran, other = releases.release(), releases.release()
    reviewed(ran)
    reviewed(other)
    s = server(served_names(ran))
    outcome = evaluate(store, s.url, ran.id, fast_policies / SUITE, channel="production",
                       by=person("ci"))
    assert outcome.report.passed
    # Nothing ran against `other`: its gate has no evidence.
    assert "no evaluation run of eval-suites/k3-core.yaml" in _gate(store, other,
                                                                      fast_policies).reason
    # The run's signed record copied beside `other` (as if someone moved it) is refused by
    # name: its statement names the key it was signed for.
    signed = store.read(f"{evaluations_prefix(ran.id)}{outcome.record.report_sha256}.json")
    key = f"{evaluations_prefix(other.id)}{outcome.record.report_sha256}.json"
    store.create(key, signed.data)
    with pytest.raises(UntrustedRecord, match=r"refused \(wrong-key\)") as copied:
        check_gates(store, other.id, "production", policies_dir=fast_policies)
    assert copied.value.exit_code == 4
    store.delete(key)
    # Rewritten by hand as the other tuple's record, it carries no signature at all.
    moved = EvaluationRecord.model_validate(
        outcome.record.model_dump() | {"tuple_id": other.id})
    store.create(key, moved.model_dump_json().encode())
    with pytest.raises(UntrustedRecord, match=r"refused \(unsigned\)"):
        check_gates(store, other.id, "production", policies_dir=fast_policies)

    # A run of an edited suite file does not count for the policy's file.
    edited = tmp_path / "k3-core-edited.yaml"
    edited.write_text((fast_policies / SUITE).read_text() + "\n# loosened\n")
    fresh = releases.release()
    reviewed(fresh)
    s2 = server(served_names(fresh))
    assert evaluate(store, s2.url, fresh.id, edited, channel="production", by=person("ci")).report.passed
    reason = _gate(store, fresh, fast_policies).reason
    assert "the latest run is of suite 'k3-core' sha256" in reason and "not the policy's" in reason


def _policy_with(fast_policies: Path, tmp_path: Path, name: str, **evaluation) -> Path:
    """A copy of ``fast_policies`` whose production evaluation settings are updated with
    ``evaluation`` (a value None: the key removed)."""
    out = tmp_path / name
    shutil.copytree(fast_policies, out)
    gates = out / "promotion-gates.yaml"
    policy = yaml.safe_load(gates.read_text())
    settings = policy["channels"]["production"]["evaluation"]
    for key, value in evaluation.items():
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = value
    gates.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out


#: The endpoint of the latency tests: a 100 ms first token (one sleep: the scheduler's noise
#: on this shared machine is small beside it) and 0-5 ms of jitter.
ENDPOINT = {"slow_first_token": 0.1, "jitter_ms": "0-5"}


def _on_production(store, tmp_path, fast_policies, server, reviewed, **candidate_faults):
    """A tuple evaluated and promoted to production on the fixture server with ``ENDPOINT``,
    and a candidate evaluated against another such server, with ``candidate_faults``."""
    releases = Releases(store, tmp_path / "scratch")
    prod, cand = releases.release(), releases.release()
    for r in (prod, cand):
        reviewed(r)
    evaluate(store, server(served_names(prod), **ENDPOINT).url, prod.id,
             fast_policies / SUITE, channel="production", by=person("ci"))
    staged_for(store, prod, fast_policies)  # production comes after staging
    promote(store, prod.id, "production", actor="alice", policies_dir=fast_policies)
    outcome = evaluate(store, server(served_names(cand), **ENDPOINT, **candidate_faults).url,
                       cand.id, fast_policies / SUITE, channel="production", by=person("ci"))
    return prod, cand, outcome


@pytest.mark.slow
def test_the_same_endpoint_with_jitter_passes(store, tmp_path, fast_policies, server, reviewed):
    prod, cand, outcome = _on_production(store, tmp_path, fast_policies, server, reviewed)
    assert outcome.report.passed, outcome.report.regressions
    gate = _gate(store, cand, fast_policies)
    assert gate.passed, gate.reason
    assert f"latency against {prod.id}: pass: within tolerance" in gate.reason


@pytest.mark.slow
@pytest.mark.parametrize("slowdown", [1.3, 3.0], ids=["30%", "3x"])
def test_a_slower_candidate_fails_the_gate_with_its_samples_in_the_signed_record(
        store, tmp_path, fast_policies, server, reviewed, slowdown):
    prod, cand, outcome = _on_production(store, tmp_path, fast_policies, server, reviewed,
                                         slowdown=slowdown)
    report = outcome.report
    assert not report.failed and report.pass_rate == 1.0  # every check and case passed...
    assert report.regressions and not report.passed  # ...but it is slower: NOT READY
    # The evidence, as signed: both sides' samples and the test's numbers.
    (stored,) = list_evaluations(store, cand.id)
    body = stored.report
    assert len(body["latency"]["e2e"]) >= 40 and len(body["baseline"]["e2e_samples"]) >= 40
    assert body["comparison"]["outcome"] == "fail"
    assert body["comparison"]["p_value"] < 0.01
    assert body["comparison"]["shift_ms"] > body["comparison"]["tolerance_ms"]
    gate = _gate(store, cand, fast_policies)
    assert not gate.passed
    assert f"against {prod.id}: fail: slower beyond tolerance: end-to-end latency" in gate.reason
    assert "Mann-Whitney p" in gate.reason


@pytest.mark.slow
def test_the_gate_judges_the_recorded_samples_by_the_policy_in_force(
        store, tmp_path, fast_policies, server, reviewed):
    """The run's verdict is advisory: the same evidence passes under a looser policy, fails
    again under a stricter one, and ``max_regression: null`` compares nothing."""
    prod, cand, outcome = _on_production(store, tmp_path, fast_policies, server, reviewed,
                                         slowdown=3.0)
    assert not outcome.report.passed  # NOT READY by the policy it ran under
    assert not _gate(store, cand, fast_policies).passed
    loose = _policy_with(fast_policies, tmp_path, "loose", latency_regression={"margin": 5.0})
    gate = _gate(store, cand, loose)
    assert gate.passed, gate.reason
    assert "pass: within tolerance" in gate.reason
    # Stricter again (a new version: the same text again is a policy version already used).
    strict = _policy_with(fast_policies, tmp_path, "strict", latency_regression={"margin": 0.1})
    assert not _gate(store, cand, strict).passed
    off = _policy_with(fast_policies, tmp_path, "off", max_regression=None)
    gate = _gate(store, cand, off)
    assert gate.passed, gate.reason
    assert "latency not compared (no max_regression" in gate.reason
    staged_for(store, cand, off)
    assert promote(store, cand.id, "production", actor="alice", policies_dir=off).changed


@pytest.mark.slow
def test_a_stricter_sample_size_makes_recorded_evidence_inconclusive(
        store, tmp_path, fast_policies, server, reviewed):
    prod, cand, outcome = _on_production(store, tmp_path, fast_policies, server, reviewed)
    assert outcome.report.latency is not None
    drawn = len(outcome.report.latency.e2e)  # 40, or more where a round was inconclusive
    more = _policy_with(fast_policies, tmp_path, "more", latency_regression={
        "min_samples": drawn + 8, "max_samples": drawn + 8})
    gate = _gate(store, cand, more)
    assert not gate.passed
    assert "inconclusive (counted as fail, as the policy says)" in gate.reason
    assert f"candidate samples, fewer than the {drawn + 8} a side" in gate.reason
    lenient = _policy_with(fast_policies, tmp_path, "lenient", latency_regression={
        "min_samples": drawn + 8, "max_samples": drawn + 8, "inconclusive": "pass"})
    assert _gate(store, cand, lenient).passed
    # A candidate run recorded before samples were (none) is inconclusive too: run it again.
    record_run(store, outcome.report.model_copy(update={"latency": None}), by=person("ci"))
    defaults = _policy_with(fast_policies, tmp_path, "defaults", latency_regression={})
    gate = _gate(store, cand, defaults)
    assert not gate.passed
    assert "0 candidate samples, fewer than the 40 a side" in gate.reason


def test_a_baseline_run_from_before_samples_is_not_compared_by_latency(
        store, tmp_path, fast_policies, server, reviewed):
    """A run recorded before per-request samples (its report has none) still reads; a
    candidate judged against it is compared by pass rate only, and the gate says so."""
    releases = Releases(store, tmp_path / "scratch")
    prod, cand = releases.release(), releases.release()
    for r in (prod, cand):
        reviewed(r)
    old = evaluate(store, server(served_names(prod)).url, prod.id, fast_policies / SUITE,
                   channel="production", by=person("ci")).report
    old_style = old.model_copy(update={"latency": None})  # as written before samples
    record_run(store, old_style, by=person("ci"))
    staged_for(store, prod, fast_policies)
    promote(store, prod.id, "production", actor="alice", policies_dir=fast_policies)
    evaluate(store, server(served_names(cand)).url, cand.id, fast_policies / SUITE,
             channel="production", by=person("ci"))
    gate = _gate(store, cand, fast_policies)
    assert gate.passed, gate.reason
    assert f"latency not compared: {prod.id}'s run" in gate.reason
    assert "predates per-request samples" in gate.reason


def test_smoke_of_an_endpoint_started_from_another_tuple_fails_models(store, tmp_path, server,
                                                                    k3a_env):
    releases = Releases(store, tmp_path / "scratch")
    wanted, running = releases.release(), releases.release()
    assert served_name(wanted) == served_name(running)  # one profile: one served model name
    env = dict(k3a_env, K3A_STORE=store.url, K3A_ACTOR="ci")
    s = server(served_names(running))
    result = invoke("smoke", s.url, "--tuple", wanted.id, "--max-concurrency",
                    "1", "--json", env=env, expect=5)
    report = result.json["report"]
    models = report["checks"][0]
    assert models["name"] == "models" and not models["passed"]
    assert f"serves tuple(s) {running.id}, not {wanted.id}" in models["detail"]
    assert report["expected_model"] == wanted.id
    ok = invoke("smoke", s.url, "--tuple", running.id, "--max-concurrency",
                "1", "--json", env=env)
    assert json.loads(ok.stdout)["report"]["served_models"] == served_names(running)


def test_a_server_loaded_with_another_revision_under_this_tuple_id_is_not_ready(
        store, tmp_path, server):
    """Started with revision 2's tuple id (so `models` passes) on revision 1's weights: vLLM's
    /v1/models says which path it loaded, and the `loaded` check names the commits."""
    from k3artifacts.readiness.run import run_readiness
    from k3artifacts.readiness.suite import SmokeSettings, SweepSettings

    releases = Releases(store, tmp_path / "scratch")
    one, two = releases.release(), releases.release()
    w1, w2 = one.binding.weights, two.binding.weights
    settings = SmokeSettings(sweep=SweepSettings(max_concurrency=1, max_tokens=8))

    def checks(**faults):
        report = run_readiness(server(served_names(two), **faults).url, two, settings)
        return report, {c.name: c for c in report.checks}

    report, found = checks(model=f"/nvme/k3a/models/{w1.repo_id}/{w1.commit}")
    assert found["models"].passed and not found["loaded"].passed and not report.passed
    assert (f"loaded /nvme/k3a/models/{w1.repo_id}/{w1.commit}: commit {w1.commit[:12]}, but "
            f"the tuple binds {w2.commit[:12]}") in found["loaded"].detail
    _, found = checks(model=f"/nvme/k3a/models/{w2.repo_id}/{w2.commit}")
    assert found["loaded"].passed, found["loaded"].detail
    _, found = checks(model="moonshotai/Kimi-K3")
    assert not found["loaded"].passed
    assert "loaded moonshotai/Kimi-K3: neither the tuple's model path /opt/ml/model" in \
        found["loaded"].detail
    # The profile's context length is the tuple's serving argument too.
    long = releases.tuple_for(store.read_manifest(w2.repo_id, w2.commit),
                              profile="b200x8-2node-tp8-pp2")
    report = run_readiness(server(served_names(long), max_model_len=8192).url, long, settings)
    loaded = next(c for c in report.checks if c.name == "loaded")
    assert not loaded.passed
    assert "max_model_len 8192, but the profile's --max-model-len is 131072" in loaded.detail


def test_long_context_is_sized_in_the_endpoints_own_tokens(store, tmp_path, server):
    """A small vocabulary (2 characters a token): a words-per-token guess would send about
    twice the server's limit; counted by the endpoint, the prompt fits and is answered."""
    from k3artifacts.readiness.run import run_readiness
    from k3artifacts.readiness.suite import SmokeSettings, SweepSettings

    release = Releases(store, tmp_path / "scratch").release()
    s = server(served_names(release), max_model_len=4096, chars_per_token=2)
    settings = SmokeSettings(sweep=SweepSettings(max_concurrency=1, max_tokens=8))
    report = run_readiness(s.url, release, settings)
    check = next(c for c in report.checks if c.name == "long_context")
    assert check.passed, check.detail
    assert "target 3584" in check.detail and "measured with /tokenize" in check.detail
    seen = int(check.detail.split()[0])
    assert 3584 - 10 < seen <= 3584
    words = int(3584 * 0.75)  # what the guess sent: this server counts far more tokens
    body = json.dumps({"model": release.id, "prompt": " ".join(["alpha"] * words)}).encode()
    req = urllib.request.Request(s.url.removesuffix("/v1") + "/tokenize", data=body,
                                 headers={"Content-Type": "application/json"})
    assert json.load(urllib.request.urlopen(req, timeout=5))["count"] > 4096


def test_smoke_cli_reports_json_and_a_dead_endpoint_exits_8(store, tmp_path, server, k3a_env):
    release = Releases(store, tmp_path / "scratch").release()
    env = dict(k3a_env, K3A_STORE=store.url)
    s = server(served_names(release))
    ok = invoke("smoke", s.url.removesuffix("/v1"), "--tuple", release.id,
                "--max-concurrency", "2", "--json", env=env)
    body = ok.json
    assert body["passed"] and body["report"]["kind"] == "smoke" and body["written"]
    assert "readiness pass sweep" in ok.stderr  # log lines when stderr is not a terminal

    (port,) = free_ports(1)
    began = time.monotonic()
    dead = invoke("smoke", f"http://127.0.0.1:{port}", "--tuple", release.id,
                  "--retries", "0", env=env, expect=8)
    assert time.monotonic() - began < 5
    assert f"127.0.0.1:{port}/v1 is unreachable: connection refused" in dead.stderr
    assert "next:" in dead.stderr
    listed = invoke("eval", "list", release.id, env=env)
    assert listed.stdout.count(" run ") == 2  # both runs recorded, the dead one too


def test_knee_and_percentiles():
    def point(c: int, tps: float, breach: str | None = None) -> SweepPoint:
        return SweepPoint(concurrency=c, requests=4, ok=4, errors=0, rate_limited=0,
                          ttft_p50=0.1, ttft_p99=0.1, e2e_p50=1, e2e_p99=1, tokens_per_s=tps,
                          breach=breach)

    assert knee([point(1, 100), point(2, 190), point(4, 200)]) == 2  # +5%: past the knee
    assert knee([point(1, 100), point(2, 190), point(4, 380, "TTFT")]) == 2
    assert knee([point(1, 100, "429s")]) is None
    assert percentile([0.1, 0.2, 0.3, 5.0], 0.99) == 5.0
    assert percentile([0.1, 0.2, 0.3, 5.0], 0.5) == 0.2


def test_the_checkout_suite_is_the_one_production_names():
    policy = yaml.safe_load((REPO_ROOT / "policies" / "promotion-gates.yaml").read_text())
    assert policy["channels"]["production"]["evaluation"]["suite_file"] == SUITE
    assert (REPO_ROOT / "policies" / SUITE).is_file()


@pytest.mark.s3
def test_run_reports_are_create_once_beside_the_tuple_on_s3(s3_store, tmp_path, fast_policies,
                                                             server):
    from k3artifacts.releases.evaluations import record_run

    use_policy(s3_store, fast_policies)  # the records are read through its identities
    release = Releases(s3_store, tmp_path / "scratch").release()
    outcome = evaluate(s3_store, server(served_names(release)).url, release.id,
                       fast_policies / SUITE, channel="production", by=person("ci"))
    assert outcome.written
    again, written = record_run(s3_store, outcome.report, by=person("someone-else"))
    assert not written and again.attached_by == "ci"  # the first record stands
    (stored,) = list_evaluations(s3_store, release.id)
    assert stored.readiness() == outcome.report
    assert stored.readiness().suite_sha256 == hashlib.sha256(
        (fast_policies / SUITE).read_bytes()).hexdigest()


def test_sweep_records_429_rates_and_stops_at_the_first_breach(store, tmp_path, server):
    from k3artifacts.readiness.run import run_readiness
    from k3artifacts.readiness.suite import SmokeSettings, SweepSettings

    release = Releases(store, tmp_path / "scratch").release()
    s = server(served_names(release), token_delay=0.01, max_inflight=2)
    settings = SmokeSettings(sweep=SweepSettings(max_concurrency=16, max_tokens=16))
    report = run_readiness(s.url, release, settings)
    assert report.sweep is not None
    points = {p.concurrency: p for p in report.sweep.points}
    assert sorted(points) == [1, 2, 4], points  # 8 and 16 never ran: 4 broke the SLO
    assert points[2].rate_limited == 0 and points[2].breach is None
    assert points[4].rate_limited > 0 and "rate-limited 429" in points[4].breach
    assert report.sweep.knee in (1, 2)
    sweep_check = report.checks[-1]
    assert sweep_check.passed and "stopped at 4" in sweep_check.detail


def test_eval_run_cli_names_the_failed_checks_and_exits_5(store, tmp_path, fast_policies,
                                                          server, k3a_env):
    release = Releases(store, tmp_path / "scratch").release()
    use_policy(store, fast_policies)
    env = dict(k3a_env, K3A_STORE=store.url, K3A_POLICIES=str(fast_policies))
    s = server(served_names(release), malformed_json=True)
    result = invoke("eval", "run", s.url, "--tuple", release.id,
                    "--suite", str(fast_policies / SUITE), env=env, expect=5)
    assert ("evaluation failed for " + release.id + ": structured_output, tool_call, "
            "structured-invoice, tool-weather") in result.stderr
    assert "pass rate: 81.8% (9/11 that ran; suite threshold 95.0%)" in result.stdout
    assert "NOT READY" in result.stdout
    gates = invoke("gates", release.id, "production", env=env, expect=5)
    assert "check structured_output failed" in gates.stdout


def test_eval_run_names_an_unknown_suite_and_a_channel_without_one(store, tmp_path, k3a_env):
    release = Releases(store, tmp_path / "scratch").release()
    env = dict(k3a_env, K3A_STORE=store.url)
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    unknown = invoke("eval", "run", url, "--tuple", release.id, "--suite",
                     "k3-kore", env=env, expect=7)
    assert "no suite 'k3-kore': not a file, and policy packaged defaults" in unknown.stderr
    assert "has no eval-suites/k3-kore.yaml" in unknown.stderr
    assert "suites of the policy: k3-core" in unknown.stderr
    none = invoke("eval", "run", url, "--tuple", release.id, "--channel",
                  "staging", env=env, expect=9)
    assert "channel 'staging' of policy packaged defaults" in none.stderr
    assert "names no evaluation suite" in none.stderr
