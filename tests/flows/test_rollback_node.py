"""The rollback-node flow runs the single-node procedure (tests/test_single_node_rollback.py)
as a Prefect run: each step logged, the steps table as an artifact, a failure failing the run."""

from __future__ import annotations

from flows.rollback_node import rollback_node
from k3artifacts.releases.channels import read_state
from k3artifacts.serving.render.common import served_names
from tests.support.openai_server import start
from tests.test_single_node_rollback import channel, cluster  # noqa: F401 - fixtures


def test_rollback_node_flow(tmp_path, cluster, channel):  # noqa: F811 - fixtures
    config, calls = cluster
    store, a, b = channel
    node = start(served_names(a), tmp_path / "node.log")
    try:
        out = rollback_node(kubeconfig=str(config), endpoint=node.url,
                            metrics_url=f"http://127.0.0.1:{node.port}/metrics",
                            channel="staging", namespace="serving", store_url=store.url,
                            drain_timeout_s=10, ready_timeout_s=10)
    finally:
        node.stop()
    assert [s["name"] for s in out["steps"]] == [
        "stop_admitting", "drain", "apply", "ready", "smoke", "reopen", "pointer"]
    assert read_state(store, "staging").tuple_id == a.id
