"""`k3a rollback --single-node`: stop admitting, drain (vLLM's num_requests_running reaching 0),
apply the previous tuple, smoke it, reopen, move the pointer; each step recorded, in order.
The node is the OpenAI-compatible test server with requests in flight; the cluster is a
Kubernetes API on loopback that records every request it is sent. A rollback the pointer move
refuses (a target the channel never served, an approval missing or for another move) is refused
before the cluster, the node or the store is touched."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import urllib3

from k3artifacts.policy.approvals import request_approval
from k3artifacts.policy.decide import decide
from k3artifacts.policy.signed import read_signed
from k3artifacts.preflight.kube import KubeAPI
from k3artifacts.promotion.single_node import SINGLE_NODE, rollback_single_node, running_requests
from k3artifacts.readiness.suite import SmokeSettings, SweepSettings
from k3artifacts.releases.channels import read_state
from k3artifacts.releases.reviewing import review_code, review_license
from k3artifacts.serving.render.common import served_name, served_names
from k3artifacts.stores.file import FileStore
from tests.fixtures.moves import as_acting, promote, use_policy
from tests.fixtures.people import person
from tests.support.openai_server import start
from tests.support.releases import Releases
from tests.support.waiting import wait_until
from tests.support.witness import RecordingServer, tree_snapshot

QUICK = SmokeSettings(long_context_tokens=64,
                      sweep=SweepSettings(max_concurrency=2, requests_per_worker=1, max_tokens=4))


def _kube_api(method: str, path: str, body):
    """A Kubernetes API that echoes what it is patched with and reports the Deployment
    rolled out."""
    if method == "PATCH":
        return 200, body
    if method == "GET" and "/deployments/" in path:
        return 200, {"kind": "Deployment", "metadata": {"generation": 2},
                     "spec": {"replicas": 1},
                     "status": {"observedGeneration": 2, "updatedReplicas": 1,
                                "availableReplicas": 1}}
    return 404, {"kind": "Status", "code": 404}


@pytest.fixture
def cluster(tmp_path):
    """The cluster's API on loopback: every request it is sent, whatever the method, is kept
    (``calls``)."""
    with RecordingServer(_kube_api) as api:
        yield api.kubeconfig(tmp_path / "kubeconfig"), api.calls


@pytest.fixture
def channel(tmp_path, policies):
    """staging served A, then B: the rollback returns the node to A."""
    store = FileStore(tmp_path / "store")
    rel = Releases(store, tmp_path / "scratch")
    a, b = rel.release(), rel.release()
    use_policy(store, policies)  # the store's root, which every signed record names
    for t in (a, b):
        review_license(store, t.id, by=person("rita"))
        review_code(store, t.id, by=person("rita"))
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
    wait_until(lambda: running_requests(metrics) == n, f"{n} requests in flight", timeout=20)


def _held_node(tmp_path, release):
    """The node serving ``release``, its completions held before their first token while the
    file returned exists: in flight exactly as long as the test needs them, however slow the
    machine. (A fixed slow first token, 1.5 s, also slowed the smoke's own requests to within
    0.5 s of its 2 s TTFT SLO: under load the smoke step failed.) Its access log is the third
    value returned."""
    hold, log = tmp_path / "hold", tmp_path / "node.log"
    hold.touch()
    return start(served_names(release), log, hold_file=hold, access_log=True), hold, log


def _metrics_reads(log) -> int:
    """How many times the node has answered ``GET /metrics``, by its access log."""
    return log.read_text().count('"GET /metrics HTTP/1.1" 200')


CLOSED = {"spec": {"selector": {"k3a.io/admitting": "closed"}}}


def test_steps_in_order_after_the_node_drained(tmp_path, cluster, channel):
    config, calls = cluster
    store, a, b = channel
    node, hold, log = _held_node(tmp_path, a)
    try:
        metrics = f"http://127.0.0.1:{node.port}/metrics"
        finished = _in_flight(node.url, served_name(a), 3)
        _wait_running(metrics, 3)
        with ThreadPoolExecutor(1) as pool:
            rolling = pool.submit(
                rollback_single_node, store, "staging", kube=KubeAPI(config), name="kimi",
                namespace="serving", endpoint=node.url, metrics_url=metrics,
                acting=as_acting("oncall"), settings=QUICK, poll_s=0.1, drain_timeout_s=30,
                ready_timeout_s=30)
            # Let the requests go once the drain has seen them in flight: the first read of
            # the node's metrics after the Service stopped admitting is the drain's.
            try:
                wait_until(lambda: rolling.done() or any(c.body == CLOSED for c in calls),
                           "the Service to stop admitting")
                before = _metrics_reads(log)
                wait_until(lambda: rolling.done() or _metrics_reads(log) > before,
                           "the drain to read the node's metrics")
            finally:
                released = time.monotonic()
                hold.unlink()
            done = rolling.result(timeout=120)
        wait_until(lambda: len(finished) == 3, "the in-flight requests answered")
    finally:
        node.stop()
    report = done.report
    assert [s.name for s in report.steps] == [
        "stop_admitting", "drain", "apply", "ready", "smoke", "reopen", "pointer"]
    assert report.completed, [s.detail for s in report.steps if not s.passed]
    assert (report.from_tuple, report.to_tuple) == (b.id, a.id)
    assert "in flight: 3 at most, 0 after" in report.steps[1].detail
    # Nothing was applied before the in-flight requests were let go (and the drain saw none
    # running); each was answered, after that.
    applies = [c.at for c in calls
               if "apply-patch" in (c.content_type or "") and "/deployments/" in c.path]
    assert applies and min(applies) > released and min(finished) > released
    patches = [(c.path, c.body) for c in calls if c.method == "PATCH"]
    assert patches[0] == ("/api/v1/namespaces/serving/services/kimi", CLOSED)
    deployment = next(body for path, body in patches if "/deployments/kimi" in path)
    assert deployment["metadata"]["labels"]["k3a.io/tuple-id"] == a.id
    assert ("/api/v1/namespaces/serving/services/kimi",
            {"spec": {"selector": {"k3a.io/admitting": None}}}) in patches
    assert read_state(store, "staging").tuple_id == a.id
    assert done.key.startswith("releases/single-node/staging/")
    # The record is signed by who rolled back, and read only through that signature.
    assert read_signed(store, done.key, SINGLE_NODE) == report and report.by == "oncall"


def test_a_drain_that_times_out_changes_nothing_and_reopens(tmp_path, cluster, channel):
    config, calls = cluster
    store, a, b = channel
    node, hold, _ = _held_node(tmp_path, a)
    try:
        metrics = f"http://127.0.0.1:{node.port}/metrics"
        finished = _in_flight(node.url, served_name(a), 1)
        _wait_running(metrics, 1)
        report = rollback_single_node(
            store, "staging", kube=KubeAPI(config), name="kimi", namespace="serving",
            endpoint=node.url, metrics_url=metrics, acting=as_acting("oncall"), settings=QUICK,
            poll_s=0.1, drain_timeout_s=0.5).report
        # the request the drain waited for is still answered once let go
        hold.unlink()
        wait_until(lambda: finished, "the in-flight request to finish", timeout=20)
    finally:
        node.stop()
    assert [(s.name, s.passed) for s in report.steps] == [
        ("stop_admitting", True), ("drain", False), ("reopen", True)]
    assert "not reached within 0.5 s (1 request(s) running)" in report.steps[1].detail
    assert not any("apply-patch" in (c.content_type or "") for c in calls)
    assert read_state(store, "staging").tuple_id == b.id


def test_cli_needs_the_node_to_act_on(channel, k3a_cmd, k3a_env):
    store, _, _ = channel
    run = subprocess.run([*k3a_cmd, "rollback", "staging", "--single-node", "--store", store.url],
                         env=k3a_env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 9
    assert "--single-node needs --kubeconfig, --endpoint, --metrics" in run.stderr


def _refused_on_the_node(store, config, k3a_cmd, k3a_env, *args):
    """`k3a rollback staging --single-node ...` against a node and a cluster that record every
    request; returns the run, what the node was sent, and whether the store changed."""
    with RecordingServer() as node:
        before = tree_snapshot(store.root)
        run = subprocess.run(
            [*k3a_cmd, "rollback", "staging", "--single-node", "--kubeconfig", str(config),
             "--endpoint", f"{node.url}/v1", "--metrics", f"{node.url}/metrics",
             "--namespace", "serving", "--store", store.url, *args],
            env=k3a_env, capture_output=True, text=True, timeout=120)
        return run, list(node.calls), tree_snapshot(store.root) != before


def test_a_target_the_channel_never_served_touches_no_node(tmp_path, cluster, channel,
                                                           k3a_cmd, k3a_env):
    config, calls = cluster
    store, _, b = channel
    third = Releases(store, tmp_path / "scratch-c")
    third.count = 2  # the channel fixture published revisions 1 and 2
    never = third.release()
    run, node_calls, changed = _refused_on_the_node(store, config, k3a_cmd, k3a_env,
                                                    "--to", never.id)
    assert run.returncode == 7, run.stderr
    assert f"{never.id} has never been on channel staging" in run.stderr
    assert calls == [] and node_calls == [] and not changed
    assert read_state(store, "staging").tuple_id == b.id


@pytest.mark.parametrize("approval", ["none", "of another move"])
def test_a_rollback_without_the_approval_the_policy_requires_touches_no_node(
        tmp_path, cluster, channel, policies, k3a_cmd, k3a_env, approval):
    config, calls = cluster
    store, a, b = channel
    gates = policies / "promotion-gates.yaml"
    gates.write_text(gates.read_text().replace(
        "    gates: [artifact, license, remote_code]\n",
        "    gates: [artifact, license, remote_code]\n    rollback_approval: true\n", 1))
    use_policy(store, policies)
    args = []
    if approval == "of another move":
        other = request_approval(store, action="rollback", by=as_acting("oncall"),
                                 channel="staging", tuple_id=b.id)
        decide(store, other.id, by=as_acting("bob"), approve=True)
        args = ["--approval", other.id]
    run, node_calls, changed = _refused_on_the_node(store, config, k3a_cmd, k3a_env, *args)
    assert run.returncode == 5, run.stderr
    reason = "requires an approval" if approval == "none" else "not this rollback"
    assert reason in run.stderr and a.id in run.stderr
    assert calls == [] and node_calls == [] and not changed
    assert read_state(store, "staging").tuple_id == b.id
