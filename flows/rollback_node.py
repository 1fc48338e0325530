"""Flow ``rollback-node``: roll one serving node back to the channel's previous tuple, a
Prefect task per run and an artifact listing every step (stop admitting, drain, apply, ready,
smoke, reopen, pointer) with what it saw. The same procedure without Prefect:
``k3a rollback CHANNEL --single-node --kubeconfig K --endpoint URL --metrics URL``. The move
(``promotion/single_node.py``) plans the pointer move before the node is touched, and records
the steps.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from k3artifacts.errors import GateFailed
from k3artifacts.preflight.kube import KubeAPI
from k3artifacts.promotion.single_node import SingleNodeRollback, Step, rollback_single_node

from .approval import flow_actor
from .common import slug, store_from


@task(name="rollback-node-steps", cache_policy=NO_CACHE, persist_result=False)
def node_steps(store_url: str | None, channel: str, to: str | None, kubeconfig: str,
               name: str | None, namespace: str, endpoint: str, metrics_url: str,
               reason: str | None, approval: str | None, drain_timeout_s: float,
               ready_timeout_s: float) -> SingleNodeRollback:
    logger = get_run_logger()
    store = store_from(store_url)

    def log(step: Step) -> None:
        (logger.info if step.passed else logger.error)(
            "%s %s (%.1f s): %s", "ok" if step.passed else "FAIL", step.name, step.seconds,
            step.detail)

    return rollback_single_node(
        store, channel, kube=KubeAPI(Path(kubeconfig)), name=name, namespace=namespace,
        endpoint=endpoint, metrics_url=metrics_url, acting=flow_actor(store), reason=reason,
        approval=approval, to=to, drain_timeout_s=drain_timeout_s, ready_timeout_s=ready_timeout_s,
        on_step=log).report


@flow(name="rollback-node", persist_result=False)
def rollback_node(
    kubeconfig: str,
    endpoint: str,
    metrics_url: str,
    channel: str = "production",
    to: str | None = None,
    name: str | None = None,
    namespace: str = "default",
    store_url: str | None = None,
    reason: str | None = None,
    approval: str | None = None,
    drain_timeout_s: float = 600,
    ready_timeout_s: float = 5400,
) -> dict:
    """Drain the node serving ``channel`` and put its previous tuple (or ``to``) on it.
    ``approval``: an approved request of this rollback, where the store's policy sets
    ``rollback_approval`` (asked for with ``k3a rollback CHANNEL --request-approval``)."""
    report = node_steps(store_url, channel, to, kubeconfig, name, namespace, endpoint,
                        metrics_url, reason, approval, drain_timeout_s, ready_timeout_s)
    rows = "\n".join(f"| {s.name} | {'pass' if s.passed else 'FAIL'} | {s.seconds:.1f} s | "
                     f"{s.detail.replace('|', '/')} |" for s in report.steps)
    create_markdown_artifact(
        f"# {channel}: node rollback {report.from_tuple} -> {report.to_tuple}\n\n"
        f"| step | result | time | detail |\n| --- | --- | --- | --- |\n{rows}\n",
        key=slug("k3a-rollback-node", channel),
        description=f"single-node rollback of {channel}: every step")
    if not report.completed:
        last = report.steps[-1]
        raise GateFailed(f"node rollback of {channel} stopped at {last.name}: {last.detail}",
                         hint="see the artifact for the state the node was left in")
    return report.model_dump(mode="json")
