"""What promote and rollback share: the smoke suite against the endpoint serving the tuple,
recorded beside the tuple (signed by the flow's own identity, which needs the role
``evaluate``) and shown as a Prefect artifact (checks, latency vs concurrency)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from k3artifacts.readiness.markdown import report_markdown
from k3artifacts.readiness.record import smoke
from k3artifacts.readiness.suite import SmokeSettings
from k3artifacts.releases.evaluations import ReadinessReport
from k3artifacts.reporting import events
from k3artifacts.stores.base import Store

from .approval import flow_actor
from .common import slug
from .notify import notify


@task(name="smoke", cache_policy=NO_CACHE, persist_result=False)
def smoke_endpoint(store: Store, endpoint: str, tuple_id: str, *,
                   channel: str) -> ReadinessReport:
    """Smoke ``endpoint`` for ``tuple_id``; the report is stored and published, pass or fail."""
    logger = get_run_logger()
    outcome = smoke(store, endpoint, tuple_id, SmokeSettings(), by=flow_actor(store))
    report = outcome.report
    create_markdown_artifact(report_markdown(report), key=slug("k3a-smoke", channel),
                             description=f"smoke of {tuple_id} at {endpoint}")
    logger.info("smoke of %s at %s: %s (report %s)", tuple_id, endpoint,
                "ready" if report.passed else "NOT READY", outcome.record.report_sha256[:12])
    if not report.passed:
        notify(events.readiness_failed(
            tuple_id, channel, endpoint=report.endpoint, kind=report.kind,
            failed={c.name: c.detail for c in report.failed} or {"verdict": "; ".join(
                report.problems())},
            report_sha256=outcome.record.report_sha256))
    return report


def not_ready(report: ReadinessReport) -> str:
    failed = "; ".join(f"{c.name}: {c.detail}" for c in report.failed[:5])
    return f"{report.endpoint} is not ready for {report.tuple_id}: {failed}"
