"""`k3a rollback --single-node`: stop admitting, drain (vLLM's num_requests_running reaching 0),
apply the previous tuple, smoke it, reopen, move the pointer; each step recorded, in order.
The node is the OpenAI-compatible test server with requests in flight; the cluster is a
Kubernetes API on loopback that records what it is sent."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from k3artifacts.preflight.kube import KubeAPI
from k3artifacts.promotion.single_node import (
    record_single_node,
    rollback_single_node,
    running_requests,
)
from k3artifacts.readiness.suite import SmokeSettings, SweepSettings
from k3artifacts.releases.channels import read_state
from k3artifacts.releases.reviews import review_code, review_license
from k3artifacts.serving.render.common import served_name, served_names
from k3artifacts.stores.file import FileStore
from tests.fixtures.moves import as_actor, promote
from tests.support.openai_server import start
from tests.support.releases import Releases

QUICK = SmokeSettings(long_context_tokens=64,
                      sweep=SweepSettings(max_concurrency=2, requests_per_worker=1, max_tokens=4))


@pytest.fixture
def cluster(tmp_path):
    """A Kubernetes API that records every call and reports the Deployment rolled out."""
    calls: list[tuple[float, str, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, body: dict):
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PATCH(self):  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length))
            calls.append((time.monotonic(), "PATCH " + self.headers["Content-Type"], self.path,
                          body))
            self._answer(body)

        def do_GET(self):  # noqa: N802
            calls.append((time.monotonic(), "GET", self.path, {}))
            self._answer({"kind": "Deployment", "metadata": {"generation": 2},
                          "spec": {"replicas": 1},
                          "status": {"observedGeneration": 2, "updatedReplicas": 1,
                                     "availableReplicas": 1}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "k3",
        "clusters": [{"name": "k3", "cluster": {
            "server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "k3", "user": {"token": "t"}}],
        "contexts": [{"name": "k3", "context": {"cluster": "k3", "user": "k3"}}]}))
    yield config, calls
    server.shutdown()
    server.server_close()


@pytest.fixture
def channel(tmp_path, policies):
    """staging served A, then B: the rollback returns the node to A."""
    store = FileStore(tmp_path / "store")
    rel = Releases(store, tmp_path / "scratch")
    a, b = rel.release(), rel.release()
    for t in (a, b):
        review_license(store, t.id, by="rita", by_source="os-user")
        review_code(store, t.id, by="rita", by_source="os-user")
        promote(store, t.id, "staging", actor="ci", policies_dir=policies)
    return store, a, b


def _in_flight(url: str, model: str, n: int) -> list[float]:
    """Start ``n`` requests; returns the list their completion times are appended to."""
    done: list[float] = []
    body = json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Reply with exactly: ok"}]})

    def one():
        resp = urllib3.request("POST", f"{url}/chat/completions", body=body, timeout=30,
                               headers={"Content-Type": "application/json"})
        assert resp.status == 200
        done.append(time.monotonic())

    for _ in range(n):
        threading.Thread(target=one, daemon=True).start()
    return done


def _wait_running(metrics: str, n: int):
    deadline = time.monotonic() + 20
    while running_requests(metrics) != n:
        assert time.monotonic() < deadline, "requests never in flight"
        time.sleep(0.05)


def test_steps_in_order_after_the_node_drained(tmp_path, cluster, channel):
    config, calls = cluster
    store, a, b = channel
    node = start(served_names(a), tmp_path / "node.log", slow_first_token=1.5)
    try:
        metrics = f"http://127.0.0.1:{node.port}/metrics"
        finished = _in_flight(node.url, served_name(a), 3)
        _wait_running(metrics, 3)
        report = rollback_single_node(
            store, "staging", kube=KubeAPI(config), name="kimi", namespace="serving",
            endpoint=node.url, metrics_url=metrics, actor=as_actor("oncall"), settings=QUICK,
            poll_s=0.1, drain_timeout_s=30, ready_timeout_s=30)
    finally:
        node.stop()
    assert [s.name for s in report.steps] == [
        "stop_admitting", "drain", "apply", "ready", "smoke", "reopen", "pointer"]
    assert report.completed, [s.detail for s in report.steps if not s.passed]
    assert (report.from_tuple, report.to_tuple) == (b.id, a.id)
    assert "in flight: 3 at most, 0 after" in report.steps[1].detail
    # nothing was applied before the last in-flight request had finished
    applies = [t for t, method, path, _ in calls
               if "apply-patch" in method and "/deployments/" in path]
    assert len(finished) == 3 and applies and min(applies) > max(finished)
    patches = [(path, body) for _, method, path, body in calls if method.startswith("PATCH")]
    assert patches[0] == ("/api/v1/namespaces/serving/services/kimi",
                          {"spec": {"selector": {"k3a.io/admitting": "closed"}}})
    deployment = next(body for path, body in patches if "/deployments/kimi" in path)
    assert deployment["metadata"]["labels"]["k3a.io/tuple-id"] == a.id
    assert ("/api/v1/namespaces/serving/services/kimi",
            {"spec": {"selector": {"k3a.io/admitting": None}}}) in patches
    assert read_state(store, "staging").tuple_id == a.id
    key = record_single_node(store, report)
    assert key.startswith("releases/single-node/staging/")


def test_a_drain_that_times_out_changes_nothing_and_reopens(tmp_path, cluster, channel):
    config, calls = cluster
    store, a, b = channel
    node = start(served_names(a), tmp_path / "node.log", slow_first_token=3)
    try:
        metrics = f"http://127.0.0.1:{node.port}/metrics"
        finished = _in_flight(node.url, served_name(a), 1)
        _wait_running(metrics, 1)
        report = rollback_single_node(
            store, "staging", kube=KubeAPI(config), name="kimi", namespace="serving",
            endpoint=node.url, metrics_url=metrics, actor=as_actor("oncall"), settings=QUICK,
            poll_s=0.1, drain_timeout_s=0.5)
        deadline = time.monotonic() + 20  # the slow request ends on its own, answered
        while not finished:
            assert time.monotonic() < deadline, "the in-flight request never finished"
            time.sleep(0.05)
    finally:
        node.stop()
    assert [(s.name, s.passed) for s in report.steps] == [
        ("stop_admitting", True), ("drain", False), ("reopen", True)]
    assert "not reached within 0.5 s (1 request(s) running)" in report.steps[1].detail
    assert not any("apply-patch" in method for _, method, _, _ in calls)
    assert read_state(store, "staging").tuple_id == b.id


def test_cli_needs_the_node_to_act_on(channel, k3a_cmd, k3a_env):
    store, _, _ = channel
    run = subprocess.run([*k3a_cmd, "rollback", "staging", "--single-node", "--store", store.url],
                         env=k3a_env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 9
    assert "--single-node needs --kubeconfig, --endpoint, --metrics" in run.stderr
