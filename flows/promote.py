"""Flow ``promote``: gates, then a release engineer's approval, then the channel pointer.

    check gates (nothing written) -> fail now if a gate fails and is not overridden
    -> smoke the ``endpoint`` serving the tuple, when given (report stored, artifact shown;
    not ready: fail, nothing moves) -> pause for ApprovalInput (approve, reviewer, reason)
    -> promote(): gates again, then a compare-and-swap of the pointer; the approval is
    recorded in the channel history entry

Rejection writes nothing and ends the run Cancelled, named "Rejected". The gates run again
after approval because the wait can be long: a review withdrawn meanwhile still blocks.
The same move without Prefect: ``k3a promote TUPLE CHANNEL``.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from k3artifacts.config import default_policies_dir
from k3artifacts.errors import GateFailed
from k3artifacts.promotion.gates import (
    GATE_TABLE_HEADER,
    GateReport,
    apply_overrides,
    channel_policy,
    check_gates,
    gate_rows,
)
from k3artifacts.promotion.moves import MoveResult, promote
from k3artifacts.releases.channels import Approval, GateResult
from k3artifacts.releases.policies import load_gate_policy
from k3artifacts.stores.base import Store

from .approval import rejected, wait_for_approval
from .common import slug, store_from
from .readiness import not_ready, smoke_endpoint


@task(name="check-gates", cache_policy=NO_CACHE, persist_result=False)
def gate_check(store: Store, tuple_id: str, channel: str, policies_dir: Path,
               actor: str | None) -> GateReport:
    return check_gates(store, tuple_id, channel, policies_dir=policies_dir, actor=actor)


@task(name="move-pointer", cache_policy=NO_CACHE, persist_result=False)
def move_pointer(store: Store, tuple_id: str, channel: str, *, actor: str, reason: str | None,
                 overrides: dict[str, str], policies_dir: Path, approval: Approval) -> MoveResult:
    return promote(store, tuple_id, channel, actor=actor, reason=reason, overrides=overrides,
                   policies_dir=policies_dir, approval=approval)


def gate_table(results: list[GateResult]) -> str:
    rows = ["| " + " | ".join(GATE_TABLE_HEADER) + " |", "|---|---|---|"]
    rows += ["| " + " | ".join(row) + " |" for row in gate_rows(results)]
    return "\n".join(rows)


@flow(name="promote", persist_result=False)
def promote_release(
    tuple_id: str,
    channel: str = "staging",
    store_url: str | None = None,
    policies_dir: str | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
    overrides: dict[str, str] | None = None,
    approval_timeout: int = 24 * 3600,
    poll_interval: int = 10,
    endpoint: str | None = None,
):
    """Move ``channel`` onto ``tuple_id`` once its gates pass and a release engineer approves.

    ``overrides``: gate name -> reason, for a failed gate someone decided to accept (recorded).
    ``endpoint``: an OpenAI-compatible URL serving ``tuple_id`` (a canary): smoke-tested before
    anyone is asked to approve.
    ``approval_timeout``: seconds to wait for the decision before failing (nothing moves).
    """
    logger = get_run_logger()
    store = store_from(store_url)
    pdir = Path(policies_dir) if policies_dir else default_policies_dir()
    overrides = overrides or {}
    report = gate_check(store, tuple_id, channel, pdir, requested_by)
    table = gate_table(report.results)
    key = slug("k3a-promote", channel)
    try:
        # The library's one override rule, before anyone is asked to approve.
        apply_overrides(channel_policy(load_gate_policy(pdir), channel, pdir), report, overrides)
    except GateFailed:
        create_markdown_artifact(f"# {tuple_id} -> {channel}: blocked\n\n{table}", key=key)
        raise
    if endpoint:
        smoked = smoke_endpoint(store, endpoint, tuple_id, by=requested_by or "prefect:promote",
                                channel=channel)
        if not smoked.passed:
            raise GateFailed(not_ready(smoked), hint="fix the endpoint, then run again")
        knee = smoked.sweep.knee if smoked.sweep else None
        table += f"\n\nsmoke of {endpoint}: ready (throughput knee at concurrency {knee})"
    logger.info("gates pass for %s -> %s; waiting for approval", tuple_id, channel)
    approval = wait_for_approval(
        f"Promote **{tuple_id}** to **{channel}**"
        + (f" (requested by {requested_by}: {reason})" if requested_by or reason else "")
        + f"\n\n{table}",
        timeout=approval_timeout,
        poll_interval=poll_interval,
    )
    if approval.decision == "rejected":
        final = rejected(approval, f"promotion of {tuple_id} to {channel}")
        create_markdown_artifact(f"# {tuple_id} -> {channel}: rejected\n\n{final.message}\n\n"
                                 f"{channel} was not changed.\n\n{table}", key=key)
        return final
    result = move_pointer(store, tuple_id, channel, actor=requested_by or approval.who,
                          reason=reason, overrides=overrides, policies_dir=pdir,
                          approval=approval)
    previous = result.previous_tuple_id or "(nothing)"
    state = f"moved from {previous}" if result.changed else "already there"
    create_markdown_artifact(
        f"# {tuple_id} -> {channel}: {state}\n\nhistory #{result.entry.seq}, approved by "
        f"{approval.who}" + (f": {approval.reason}" if approval.reason else "")
        + f"\n\n{gate_table(result.gates)}",
        key=key,
    )
    return result.model_dump(mode="json")
