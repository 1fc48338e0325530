"""Peers that answer too slowly to ever time out a read, or just often enough to look alive:
headers one byte at a time, a silent hub, a CDN that ignores ``Range`` and drops at the same
byte, 64 bytes per connection. Each ends ``k3a stage`` with exit 8 naming the peer, in
seconds, because the deadlines are made small through the environment as an operator would.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from k3artifacts.net.policy import FIRST_CONTACT_RETRY_S, RetryPolicy
from k3artifacts.staging.download import Ranges
from tests.faults.faultkit import SHARD1, file_gets
from tests.staging_helpers import REPO, small_release
from tests.support.hubfaults import Fault

pytestmark = pytest.mark.faults

#: Small enough to keep each case to seconds; the header trickle (a byte every 0.2 s) never
#: trips the 5 s read timeout, so only a deadline can end it.
FAST = {"K3A_HTTP_CONNECT_TIMEOUT": "1", "K3A_HTTP_READ_TIMEOUT": "5",
        "K3A_HTTP_DEADLINE": "1.5", "K3A_HTTP_ATTEMPTS": "2", "K3A_HTTP_BACKOFF": "0.01"}


@pytest.fixture
def stage(k3a_cmd, k3a_env, local_hub, tmp_path):
    def run(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
        started = time.monotonic()
        proc = subprocess.run(
            [*k3a_cmd, "stage", REPO, "--endpoint", local_hub.endpoint, "--store",
             f"file://{tmp_path / 'store'}", "--quarantine", str(tmp_path / "q"), "-q", *args],
            env={**k3a_env, **FAST, **env}, capture_output=True, text=True, timeout=120)
        return proc, time.monotonic() - started

    return run


def test_a_silent_hub_fails_first_contact_within_30_s_at_the_defaults():
    """A hub that accepts and never answers is waited on for its first headers twice, the
    connect timeout each time (10 s at the defaults), not eight times the read timeout (568 s
    before). The next test runs it with a 1 s connect timeout."""
    policy = RetryPolicy()
    assert 2 * policy.headers_deadline(first_contact=True) + FIRST_CONTACT_RETRY_S < 30
    assert policy.timeout(first_contact=True).read_timeout <= policy.connect_timeout


def test_a_hub_that_accepts_and_never_answers_fails_in_two_connect_timeouts(stage, local_hub,
                                                                           tmp_path):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add("/api/models/*", Fault.stall(60, times=None))
    proc, took = stage()
    assert proc.returncode == 8, proc.stderr
    assert f"hub at {local_hub.endpoint} unavailable (first contact)" in proc.stderr
    assert took < 15
    assert len([r for r in local_hub.hub.requests if "/api/" in r.url]) <= 2


@pytest.mark.parametrize("api,words", [
    # The first call: the hub never answered, so it gets the connect timeout, twice.
    ("/api/models/*", "unavailable (first contact): 127.0.0.1:{port}: no complete headers "
                      "within 1s"),
    # After the hub answered (the revision), the tree listing trickles: the deadline.
    ("/api/models/*/tree/*", "unavailable: 127.0.0.1:{port}: no complete headers within 1.5s "
                             "(after 2 attempts)"),
], ids=["first-contact", "answered-before"])
def test_hub_api_headers_one_byte_at_a_time_fail_exit_8(stage, local_hub, tmp_path, api, words):
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add(api, Fault.slow_headers(0.2))
    proc, took = stage()
    assert proc.returncode == 8, proc.stderr
    port = local_hub.endpoint.rsplit(":", 1)[1]
    assert f"hub at {local_hub.endpoint} " + words.format(port=port) in proc.stderr
    assert took < 15 and "Traceback" not in proc.stderr


def test_file_download_headers_trickled_hit_the_deadline(stage, local_hub, tmp_path):
    """The hub's own redirecting answer to /resolve/ trickles: it answered before (the API),
    so the deadline, not first contact, ends each attempt."""
    local_hub.hub.add_commit(REPO, small_release(tmp_path))
    local_hub.hub.faults.add(SHARD1, Fault.slow_headers(0.2, at="resolve"))
    proc, took = stage()
    assert proc.returncode == 8, proc.stderr
    assert (f"{SHARD1}: gave up after 2 attempts without a new byte: "
            f"{local_hub.endpoint.removeprefix('http://')}: no complete headers within 1.5s"
            in proc.stderr)
    assert took < 20


def test_a_cdn_that_ignores_range_and_drops_does_not_restart_for_ever(stage, local_hub,
                                                                      tmp_path):
    hub = local_hub.hub
    hub.add_commit(REPO, small_release(tmp_path, shard_bytes=1 << 20))
    hub.faults.add(SHARD1, Fault.whole())
    hub.faults.add(SHARD1, Fault.drop(after_bytes=256 << 10, times=None))
    proc, took = stage(K3A_HTTP_ATTEMPTS="3")
    assert proc.returncode == 8, proc.stderr
    assert f"{SHARD1}: gave up after 3 attempts without a new byte" in proc.stderr
    # Attempt 1 from byte 0, then per attempt: the resume the CDN answers whole, then byte 0.
    assert len(file_gets(hub, path=SHARD1)) <= 5
    assert took < 20


def test_64_bytes_per_connection_trips_the_rate_floor(stage, local_hub, tmp_path):
    """Every connection brings new bytes, so attempts never run out; the floor counts bytes
    across reconnects and ends it."""
    hub = local_hub.hub
    hub.add_commit(REPO, small_release(tmp_path))
    hub.faults.add(SHARD1, Fault.drop(after_bytes=64, times=None))
    proc, took = stage(K3A_HTTP_RATE_WINDOW="0.5", K3A_HTTP_ATTEMPTS="8")
    assert proc.returncode == 8, proc.stderr
    assert f"{SHARD1}: {hub.cdn_endpoint.removeprefix('http://')} too slow, 3 windows of " \
           "0.5s in a row" in proc.stderr
    assert "below the floor of 65536 B/s" in proc.stderr and "--min-rate" in proc.stderr
    assert took < 20


def test_ranges_of_a_huge_file_are_planned_one_at_a_time():
    """A file of 2^50 bytes is 33 million ranges of 32 MiB: none is made before it is asked."""
    ranges = Ranges().split(0, 2**50)
    assert next(ranges) == (0, 32 << 20)
    assert next(ranges) == (32 << 20, 64 << 20)
