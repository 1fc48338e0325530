"""The network layer against real misbehaving servers on 127.0.0.1: the Hub's RateLimit header
obeyed (and capped), headers trickled to an OpenAI client (the readiness endpoint's), and the
policy read from the settings."""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler

import openai
import pytest

from k3artifacts.errors import Unavailable
from k3artifacts.net.calls import Peer, call
from k3artifacts.net.endpoint import endpoint_client
from k3artifacts.net.policy import RetryPolicy, rate_limit_wait, server_wait
from tests.faults.faultkit import send_slowly, serving

PEER = Peer("test peer", hint="none")


def _limited(limit_header: str, *, times: int = 1):
    """A server answering 429 with ``limit_header`` as its RateLimit ``times`` times, then 200;
    it records when each request came."""
    seen: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - the base class's name
            seen.append(time.monotonic())
            limited = len(seen) <= times
            body = b'{"error":"rate limited"}' if limited else b"{}"
            self.send_response(429 if limited else 200)
            if limited:
                self.send_header("RateLimit", limit_header)
                self.send_header("RateLimit-Policy", '"api";q=1000;w=300')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler, seen


def test_the_hubs_ratelimit_header_is_waited_for():
    handler, seen = _limited('"api";r=0;t=1')
    with serving(handler) as url:
        answer = call("GET", f"{url}/api/models/x", PEER,
                      policy=RetryPolicy(attempts=3, backoff=0.001))
    assert answer.status == 200 and len(seen) == 2
    # The backoff alone would have retried after a millisecond; the hub said one second.
    assert seen[1] - seen[0] >= 0.95


def test_a_ratelimit_wait_is_capped_and_attempts_still_end():
    handler, seen = _limited('"api";r=0;t=3600', times=100)
    started = time.monotonic()
    with serving(handler) as url, pytest.raises(Unavailable) as err:
        call("GET", f"{url}/x", PEER,
             policy=RetryPolicy(attempts=3, backoff=0.001, max_retry_after=0.1))
    assert time.monotonic() - started < 5 and len(seen) == 3
    assert "HTTP 429" in str(err.value) and "(after 3 attempts)" in str(err.value)


@pytest.mark.parametrize("headers,wait", [
    ({"RateLimit": '"api";r=0;t=55'}, 55.0),
    ({"RateLimit": '"api";r=12;t=55'}, None),  # quota left: no reason to wait
    ({"RateLimit": '"resolvers";t=7'}, 7.0),
    ({"Retry-After": "3", "RateLimit": '"pages";r=0;t=9'}, 9.0),
    ({"Retry-After": "12"}, 12.0),
    ({"Retry-After": "soon"}, None),
])
def test_server_wait(headers, wait):
    assert server_wait(headers) == wait


def test_ratelimit_without_reset_asks_for_nothing():
    assert rate_limit_wait('"api";r=0') is None


def test_the_policy_comes_from_the_settings(monkeypatch):
    monkeypatch.setenv("K3A_HTTP_DEADLINE", "7")
    monkeypatch.setenv("K3A_HTTP_MIN_RATE", "1MiB")
    monkeypatch.setenv("K3A_HTTP_ATTEMPTS", "4")
    policy = RetryPolicy(attempts=2)
    assert (policy.deadline, policy.min_rate, policy.attempts) == (7.0, 1 << 20, 2)


def _trickled_headers():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - the base class's name
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" \
                   b"Connection: close\r\nContent-Length: 2\r\n\r\n{}"
            send_slowly(self.wfile, head)  # a byte every 0.1 s: never a read timeout

    return Handler


def test_an_endpoint_trickling_its_headers_times_out_the_openai_client():
    with serving(_trickled_headers()) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                               http_client=endpoint_client(connect=1, read=5,
                                                           headers_deadline=1))
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            client.models.list()
    assert time.monotonic() - started < 4


def test_a_small_call_with_trickled_headers_hits_the_deadline(monkeypatch):
    monkeypatch.setenv("K3A_HTTP_DEADLINE", "1")
    monkeypatch.setenv("K3A_HTTP_READ_TIMEOUT", "5")
    with serving(_trickled_headers()) as url:
        call("GET", f"{url}/warm", PEER, policy=RetryPolicy(deadline=60))  # answered once
        started = time.monotonic()
        with pytest.raises(Unavailable) as err:
            call("GET", f"{url}/x", PEER, policy=RetryPolicy(attempts=1))
    assert time.monotonic() - started < 4
    assert "no complete headers within 1s" in str(err.value)


def _metrics_page(page: bytes):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 - the base class's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

    return Handler


def test_running_requests_reads_the_gauge_by_name_and_refuses_what_is_not_a_count():
    """The drain of a single-node rollback reads vLLM's /metrics through the network layer."""
    from k3artifacts.errors import BadAnswer
    from k3artifacts.promotion.single_node import running_requests

    page = (b'# TYPE vllm:num_requests_running gauge\n'
            b'vllm:num_requests_running{model_name="k3t-a",engine="0"} 2.0 1733480000000\n'
            b'vllm:num_requests_running{model_name="k3t-a",engine="1"} 1.0\n'
            b'vllm:num_requests_running_total 99\n')
    with serving(_metrics_page(page)) as url:
        assert running_requests(f"{url}/metrics") == 3.0
    for value in (b"abc", b"-1", b"+Inf", b"NaN"):
        with serving(_metrics_page(b"vllm:num_requests_running " + value + b"\n")) as url:
            with pytest.raises(BadAnswer, match="not a count of requests"):
                running_requests(f"{url.replace('http://', 'http://u:pw@')}/metrics")
