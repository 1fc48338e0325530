"""Flow ``rollback``: point a channel back at a tuple it served before; no weight byte moves.

Approval is the channel's policy (``rollback_approval`` in policies/promotion-gates.yaml),
overridable per run with ``require_approval``: a rollback is usually an incident response, so
by default it does not wait. When it does, the decision is recorded in the history entry like a
promotion's, and a rejection writes nothing and ends the run Cancelled, named "Rejected".
With ``endpoint`` (the URL serving the channel once its render is re-applied), the smoke suite
runs after the move; the run fails when the endpoint is not ready: do not reopen traffic.
The same move without Prefect: ``k3a rollback CHANNEL [--to TUPLE]``.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from k3artifacts.config import default_policies_dir
from k3artifacts.errors import GateFailed
from k3artifacts.promotion.gates import channel_policy
from k3artifacts.promotion.moves import MoveResult, rollback
from k3artifacts.releases.channels import Approval, read_state
from k3artifacts.releases.policies import load_gate_policy
from k3artifacts.stores.base import Store

from .approval import rejected, wait_for_approval
from .common import slug, store_from
from .readiness import not_ready, smoke_endpoint


@task(name="move-pointer-back", cache_policy=NO_CACHE, persist_result=False)
def move_back(store: Store, channel: str, *, to: str | None, actor: str, reason: str | None,
              approval: Approval | None) -> MoveResult:
    return rollback(store, channel, to=to, actor=actor, reason=reason, approval=approval)


@flow(name="rollback", persist_result=False)
def rollback_channel(
    channel: str = "production",
    to: str | None = None,
    store_url: str | None = None,
    policies_dir: str | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
    require_approval: bool | None = None,
    approval_timeout: int = 3600,
    poll_interval: int = 10,
    endpoint: str | None = None,
):
    """Roll ``channel`` back to ``to``, or to the previous distinct tuple in its history."""
    store = store_from(store_url)
    pdir = Path(policies_dir) if policies_dir else default_policies_dir()
    if require_approval is None:
        require_approval = channel_policy(load_gate_policy(pdir), channel, pdir).rollback_approval
    approval = None
    key = slug("k3a-rollback", channel)
    if require_approval:
        now = read_state(store, channel).tuple_id
        approval = wait_for_approval(
            f"Roll **{channel}** back from {now or '(nothing)'} to {to or 'the previous tuple'}"
            + (f" (requested by {requested_by}: {reason})" if requested_by or reason else ""),
            timeout=approval_timeout,
            poll_interval=poll_interval,
        )
        if approval.decision == "rejected":
            final = rejected(approval, f"rollback of {channel}")
            create_markdown_artifact(f"# {channel}: rollback rejected\n\n{final.message}", key=key)
            return final
    actor = requested_by or (approval.who if approval else "prefect:rollback")
    result = move_back(store, channel, to=to, actor=actor, reason=reason, approval=approval)
    create_markdown_artifact(
        f"# {channel}: {result.previous_tuple_id} -> {result.tuple_id}"
        + ("" if result.changed else " (already there)")
        + f"\n\nhistory #{result.entry.seq} by {result.entry.who}"
        + (f", approved by {approval.who}" if approval else ""),
        key=key,
    )
    if endpoint:
        smoked = smoke_endpoint(store, endpoint, result.tuple_id, by=actor, channel=channel)
        if not smoked.passed:
            raise GateFailed(f"{channel} now points at {result.tuple_id}, but "
                             + not_ready(smoked),
                             hint="keep traffic closed; fix the endpoint and smoke it again")
    return result.model_dump(mode="json")
