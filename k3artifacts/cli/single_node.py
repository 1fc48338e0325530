"""``k3a rollback CHANNEL --single-node``: drain one serving node and put the previous tuple on
it, each step recorded (``promotion/single_node.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from k3artifacts.cli.common import emit
from k3artifacts.errors import ConfigError, GateFailed

if TYPE_CHECKING:
    from k3artifacts.policy.actor import Acting
    from k3artifacts.stores.base import Store


_OPTIONS = [
    click.option("--single-node", is_flag=True,
                 help="Also move the node: stop admitting, drain, apply the previous tuple, "
                 "smoke, reopen (each step recorded). Needs --kubeconfig, --endpoint, --metrics."),
    click.option("--kubeconfig", type=click.Path(dir_okay=False, exists=True, path_type=Path),
                 envvar="KUBECONFIG", default=None, help="--single-node: the cluster."),
    click.option("--name", "node_name", default=None,
                 help="--single-node: the rendered objects' name (default: as `k3a render`)."),
    click.option("--namespace", default="default", show_default=True,
                 help="--single-node: the namespace."),
    click.option("--endpoint", default=None, metavar="URL",
                 help="--single-node: the pod's OpenAI base URL (…/v1) for the smoke test."),
    click.option("--metrics", "metrics_url", default=None, metavar="URL",
                 help="--single-node: the pod's /metrics (vllm:num_requests_running)."),
    click.option("--drain-timeout", type=click.FloatRange(min=1), default=600.0,
                 show_default=True, metavar="SECONDS",
                 help="--single-node: how long in-flight requests may take to finish."),
    click.option("--ready-timeout", type=click.FloatRange(min=1), default=5400.0,
                 show_default=True, metavar="SECONDS",
                 help="--single-node: how long the previous tuple's pod may take to load."),
]


def single_node_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


def run_single_node(store: Store, channel: str, *, to: str | None, why: str | None,
                    acting: Acting, approval: str | None, as_json: bool, single_node: bool,
                    kubeconfig: Path | None,
                    node_name: str | None, namespace: str, endpoint: str | None,
                    metrics_url: str | None, drain_timeout: float,
                    ready_timeout: float) -> None:
    missing = [flag for flag, value in (("--kubeconfig", kubeconfig), ("--endpoint", endpoint),
                                        ("--metrics", metrics_url)) if value is None]
    if missing:
        raise ConfigError(f"--single-node needs {', '.join(missing)}")
    assert kubeconfig is not None and endpoint is not None and metrics_url is not None
    # Imported here: a plain `k3a rollback` (or promote) need not load the readiness client.
    from k3artifacts.preflight.kube import KubeAPI
    from k3artifacts.promotion.single_node import Step, rollback_single_node

    def say(step: Step) -> None:
        if not as_json:
            click.echo(f"  {'ok  ' if step.passed else 'FAIL'} {step.name} "
                       f"({step.seconds:.1f} s): {step.detail}", err=True)

    result = rollback_single_node(
        store, channel, kube=KubeAPI(kubeconfig), name=node_name, namespace=namespace,
        endpoint=endpoint, metrics_url=metrics_url, acting=acting, approval=approval,
        reason=why, to=to, drain_timeout_s=drain_timeout, ready_timeout_s=ready_timeout,
        on_step=say)
    report, key = result.report, result.key

    def human() -> None:
        click.echo(f"recorded: {key}")
        click.echo(f"{channel} rolled back to {report.to_tuple} on the node" if report.completed
                   else f"STOPPED at {report.steps[-1].name}: {report.steps[-1].detail}")

    emit(as_json, {"record": key, **report.model_dump(mode="json"),
                   "completed": report.completed}, human)
    if not report.completed:
        # Raised, not exited: the group prints the document with the error merged in.
        last = report.steps[-1]
        raise GateFailed(f"rollback of {channel} on the node stopped at {last.name}: "
                         f"{last.detail}", hint=f"the steps taken are recorded at {key}")
