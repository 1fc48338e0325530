"""A Prometheus that answers malformed, infinite or meaningless values, and one that trickles:
``k3a traffic analyze`` refuses each by name (exit 8, or 9 for what Prometheus itself calls an
error), records nothing, and the ``traffic`` gate never passes a stored analysis holding a value
its metric cannot take. The stand-in is a real HTTP server on 127.0.0.1 answering the query
API as told."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from k3artifacts.errors import BadAnswer, ConfigError, Unavailable
from k3artifacts.policy.rollout import TrafficPolicy
from k3artifacts.releases.analyses import MetricResult, TrafficAnalysis, record_analysis
from k3artifacts.stores.file import FileStore
from k3artifacts.traffic.analysis import analyze_step, per_bucket
from k3artifacts.traffic.prometheus import Prometheus
from k3artifacts.traffic.queries import TTFT, by_tuple, histogram_query
from tests.faults.faultkit import send_slowly, serving
from tests.fixtures.moves import check_gate, use_policy
from tests.fixtures.people import person
from tests.support.releases import Releases

TRAFFIC = {
    "steps": [{"weight": 100, "pause": "1s"}],
    "window": "1m",
    "prometheus": "http://prometheus.monitoring.svc:9090",
    "thresholds": {"quantile": 0.99, "max_e2e_s": 2.0, "max_ttft_s": 0.2,
                   "max_error_rate": 0.05, "min_requests": 10},
}
#: Which of the step's queries a PromQL text is, by what only it reads.
METRIC_OF = [("increase(", "requests"), ("e2e_request_latency", "e2e_latency"),
             ("time_to_first_token", "time_to_first_token"), ("http_requests_total", "error_rate")]
GOOD = {"requests": "40", "e2e_latency": "0.5", "time_to_first_token": "0.05",
        "error_rate": "0"}
AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def vector(value: object) -> dict:
    return {"status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, value]}]}}


class FakeAnswers:
    """What the stand-in answers: per metric, a whole API document (or a value to wrap)."""

    def __init__(self) -> None:
        self.by_metric: dict[str, object] = {}
        self.trickle = False

    def document(self, query: str) -> object:
        name = next(n for marker, n in METRIC_OF if marker in query)
        answer = self.by_metric.get(name, GOOD[name])
        return answer if isinstance(answer, dict) else vector(answer)


@pytest.fixture
def prometheus():
    answers = FakeAnswers()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - the base class's name
            query = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
            body = json.dumps(answers.document(query)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if answers.trickle:
                send_slowly(self.wfile, body)
            else:
                self.wfile.write(body)

    with serving(Handler) as url:
        yield url, answers


def analyze(url: str):
    return analyze_step(Prometheus(url), "k3t-" + "0" * 24, "production",
                        TrafficPolicy.model_validate(TRAFFIC), 0, AT)


@pytest.mark.parametrize("metric,answer,words", [
    ("requests", {"status": "success", "data": None}, "with data None, not an object"),
    ("requests", "abc", "the value 'abc', not a number"),
    ("e2e_latency", {"status": "success", "data": {"resultType": "vector",
                                                   "result": [{"value": [1.0]}]}},
     "a sample [1.0], not [time, \"value\"]"),
    ("e2e_latency", {"status": "success", "data": {"resultType": "vector", "result": [{}]}},
     "a sample None, not [time, \"value\"]"),
    ("e2e_latency", {"status": "success", "data": {"resultType": "vector", "result": [7]}},
     "a series 7, not an object"),
    ("time_to_first_token", "+Inf", "'+Inf': infinite, not a measurement"),
    ("time_to_first_token", "-Inf", "'-Inf': infinite, not a measurement"),
    ("e2e_latency", "-1", "e2e_latency = -1 is negative; a latency cannot be"),
    ("time_to_first_token", "-0.5", "time_to_first_token = -0.5 is negative; a latency cannot be"),
    ("error_rate", "-0.01", "error_rate = -0.01 is negative; a share of requests cannot be"),
    ("error_rate", "1.5", "error_rate = 1.5 is above 1"),
    ("requests", "1e308", "requests = 1e+308 is more than 1e+06 requests a second over the 1m"),
], ids=["data-null", "value-abc", "sample-ts-only", "series-empty", "series-not-object",
        "plus-inf", "minus-inf", "negative-e2e", "negative-ttft", "negative-error-rate",
        "error-rate-above-1", "1e308-requests"])
def test_a_malformed_or_meaningless_answer_is_a_named_refusal(prometheus, metric, answer,
                                                              words):
    url, answers = prometheus
    answers.by_metric[metric] = answer
    with pytest.raises(BadAnswer) as err:
        analyze(url)
    assert words in str(err.value)
    assert f"Prometheus at {url}" in str(err.value) and err.value.exit_code == 8


def test_nan_is_no_data_and_no_bound_passes_it(prometheus):
    url, answers = prometheus
    answers.by_metric["e2e_latency"] = "NaN"
    analysis = analyze(url)
    assert not analysis.passed
    assert [m.name for m in analysis.failed] == ["e2e_latency"]


def test_prometheus_own_error_is_a_configuration_refusal(prometheus):
    url, answers = prometheus
    answers.by_metric["requests"] = {"status": "error", "errorType": "bad_data",
                                     "error": "parse error"}
    with pytest.raises(ConfigError, match="Prometheus refused .*bad_data.*parse error"):
        analyze(url)


def test_a_trickled_answer_fails_within_the_deadline(prometheus, monkeypatch):
    url, answers = prometheus
    answers.trickle = True
    monkeypatch.setenv("K3A_HTTP_DEADLINE", "1")
    monkeypatch.setenv("K3A_HTTP_READ_TIMEOUT", "5")
    monkeypatch.setenv("K3A_HTTP_ATTEMPTS", "2")
    monkeypatch.setenv("K3A_HTTP_BACKOFF", "0.01")
    started = time.monotonic()
    with pytest.raises(Unavailable) as err:
        analyze(url)
    assert time.monotonic() - started < 10
    assert f"Prometheus at {url} unavailable" in str(err.value)
    assert "not complete within its deadline (after 2 attempts)" in str(err.value)


def test_a_password_in_the_prometheus_url_is_never_shown_or_recorded(prometheus):
    url, _ = prometheus
    secret = url.replace("http://", "http://admin:s3cret@")
    analysis = analyze(secret)
    assert analysis.passed and analysis.prometheus == url.replace("http://", "http://admin:***@")
    assert "s3cret" not in analysis.model_dump_json()


@pytest.fixture
def released(tmp_path, policies):
    """A store whose production channel has the traffic policy above, and a tuple in it."""
    gate_file = policies / "promotion-gates.yaml"
    doc = yaml.safe_load(gate_file.read_text())
    doc["channels"]["production"]["traffic"] = TRAFFIC
    gate_file.write_text(yaml.safe_dump(doc))
    store = FileStore(tmp_path / "store")
    use_policy(store, policies)
    return store, Releases(store, tmp_path / "scratch").release()


def test_the_traffic_gate_never_passes_a_stored_value_outside_its_meaning(released):
    """An analysis recorded before such values were refused (negative latency marked passed):
    judged again on every read, it fails the gate with the reason."""
    store, release = released
    policy = TrafficPolicy.model_validate(TRAFFIC)
    values = {"requests": 40.0, "e2e_latency": -1.0, "time_to_first_token": 0.05,
              "error_rate": 0.0}
    forged = TrafficAnalysis(
        tuple_id=release.id, channel="production", step=0, weight=100, window=policy.window,
        thresholds=policy.thresholds, at=AT, prometheus="http://prometheus:9090",
        metrics=[MetricResult(name=name, query="q", bound="min" if name == "requests" else "max",
                              limit=1.0, value=value, passed=True)
                 for name, value in values.items()])
    record_analysis(store, forged, by=person("someone"))
    verdict = check_gate(store, release, "production", "traffic")
    assert not verdict.passed
    assert "e2e_latency refused: -1 is negative; a latency cannot be" in verdict.reason


@pytest.mark.parametrize("spoiled", ["negative", "trickled", "trickled-every-attempt"])
def test_traffic_analyze_exits_8_naming_prometheus_and_records_nothing(
        prometheus, released, tmp_path, k3a_cmd, k3a_env, spoiled):
    """`k3a traffic analyze` against a Prometheus that answers a negative latency, or that
    trickles its answer past the whole-answer deadline: exit 8 naming it, nothing recorded.
    Trickled on every attempt, the call's total deadline (K3A_HTTP_CALL_DEADLINE, 120 s by
    default) ends it: each attempt was cut at its deadline and the next one tried, 8 of them,
    so a Prometheus trickling under the 60 s default failed only after about 10 minutes."""
    url, answers = prometheus
    store, release = released
    env = dict(k3a_env)
    if spoiled == "negative":
        answers.by_metric["time_to_first_token"] = "-3"
        said = (f"Prometheus at {url} answered time_to_first_token = -3 is negative; a latency "
                "cannot be")
    elif spoiled == "trickled":
        answers.trickle = True
        env.update(K3A_HTTP_DEADLINE="1", K3A_HTTP_READ_TIMEOUT="5", K3A_HTTP_ATTEMPTS="2",
                   K3A_HTTP_BACKOFF="0.01")
        said = "not complete within its deadline (after 2 attempts)"
    if spoiled == "trickled-every-attempt":
        answers.trickle = True
        env.update(K3A_HTTP_DEADLINE="2", K3A_HTTP_READ_TIMEOUT="5", K3A_HTTP_ATTEMPTS="8",
                   K3A_HTTP_BACKOFF="0.01", K3A_HTTP_CALL_DEADLINE="3")
        said = "no answer within 3 s in all (after 2 attempts), the call's deadline"
    started = time.monotonic()
    run = subprocess.run(
        [*k3a_cmd, "traffic", "analyze", release.id, "--prometheus", url, "--channel",
         "production", "--step", "0", "--json", "--store", store.url],
        env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 8, run.stderr
    # 8 attempts of 2 s each would be 16 s and more.
    assert time.monotonic() - started < (12 if spoiled == "trickled-every-attempt" else 30)
    out = json.loads(run.stdout)
    assert out["exit_code"] == 8
    assert said in out["error"] and f"Prometheus at {url}" in out["error"], out["error"]
    assert "Traceback" not in run.stderr
    assert not list((tmp_path / "store").rglob("releases/traffic/**/*.json"))



def _series(*pairs: tuple[str | None, str]) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {} if le is None else {"le": le}, "value": [1.0, count]}
        for le, count in pairs]}}


@pytest.mark.parametrize("answer,words", [
    (_series(("0.1", "5"), ("+Inf", "3")), "not a histogram"),
    (_series(("0.1", "-1"), ("+Inf", "3")), "not a histogram"),
    (_series(("0.1", "NaN")), "not a histogram"),
    (_series((None, "5")), "without a bucket bound"),
    (_series(("0.1", "abc")), "the value 'abc', not a number"),
], ids=["falling", "negative", "nan", "no-le", "not-a-number"])
def test_bucket_counts_that_are_no_histogram_are_refused(prometheus, answer, words):
    """The histograms a canary is compared with the stable pods by are read as hostile too."""
    url, answers = prometheus
    answers.by_metric["requests"] = answer  # the histogram query reads increase(), as it does
    with pytest.raises(BadAnswer) as err:
        Prometheus(url).buckets(histogram_query(TTFT, by_tuple("k3t-" + "0" * 24), "1m"), AT)
    assert words in str(err.value) and err.value.exit_code == 8


def test_bucket_counts_become_requests_per_bucket(prometheus):
    url, answers = prometheus
    answers.by_metric["requests"] = _series(("0.01", "4"), ("0.02", "10.5"), ("0.04", "10.5"),
                                            ("+Inf", "12"))
    counts = Prometheus(url).buckets(histogram_query(TTFT, by_tuple("k3t-" + "0" * 24), "1m"), AT)
    # Beyond the last finite bound counts at it; empty buckets are left out.
    assert per_bucket(counts) == [(0.01, 4.0), (0.02, 6.5), (0.04, 1.5)]
