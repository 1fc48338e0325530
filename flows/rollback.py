"""Flow ``rollback``: point a channel back at a tuple it served before; no weight byte moves.

Approval is the channel's policy (``rollback_approval`` in policies/promotion-gates.yaml),
overridable per run with ``require_approval``: a rollback is usually an incident response, so
by default it does not wait. When it does, the decision is recorded in the history entry like a
promotion's, and a rejection writes nothing and ends the run Cancelled, named "Rejected". A
rollback beaten by a concurrent move ends Failed, named "Lost race" (:mod:`flows.decisions`).
With ``endpoint`` (the URL serving the channel once its render is re-applied), the smoke suite
runs after the move; the run fails when the endpoint is not ready: do not reopen traffic.
The same move without Prefect: ``k3a rollback CHANNEL [--to TUPLE]``.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from k3artifacts.errors import GateFailed
from k3artifacts.promotion.gates import channel_policy
from k3artifacts.promotion.moves import MoveResult, rollback
from k3artifacts.releases.channels import Approval, iter_history_reversed, read_state
from k3artifacts.releases.policies import load_gate_policy
from k3artifacts.settings import default_policies_dir
from k3artifacts.stores.base import Store

from .approval import form_text, rejected, wait_for_approval
from .common import slug, store_from
from .decisions import DECISIONS, Refused, end_refused
from .logs import quiet_task_completions
from .move_records import move_record, outcome_line, tuple_facts
from .naming import label_run, rollback_name, tags
from .readiness import not_ready, smoke_endpoint


@task(name="move-pointer-back", cache_policy=NO_CACHE, persist_result=False)
def move_back(store: Store, channel: str, *, to: str | None, actor: str, reason: str | None,
              approval: Approval | None) -> MoveResult | Refused:
    try:
        return rollback(store, channel, to=to, actor=actor, reason=reason, approval=approval)
    except DECISIONS as exc:
        return Refused.of(exc)


def _default_target(store: Store, channel: str) -> str | None:
    """The tuple a rollback without ``to`` would pick (for the form; the move decides again)."""
    state = read_state(store, channel)
    if state.pointer is None:
        return None
    return next((e.tuple_id for e in iter_history_reversed(store, channel, state.pointer)
                 if e.tuple_id != state.pointer.tuple_id), None)


@flow(name="rollback", flow_run_name=rollback_name, persist_result=False)
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
    quiet_task_completions()
    logger = get_run_logger()
    store = store_from(store_url)
    pdir = Path(policies_dir) if policies_dir else default_policies_dir()
    label_run(tags(channel=channel, tuple_id=to))
    if require_approval is None:
        require_approval = channel_policy(load_gate_policy(pdir), channel, pdir).rollback_approval
    approval = None
    key = slug("k3a-rollback", channel)
    now_id = read_state(store, channel).tuple_id
    before = tuple_facts(store, now_id)
    if require_approval:
        target = to or _default_target(store, channel)
        approval = wait_for_approval(
            form_text(f"Roll {channel} back", store, now=before, now_id=now_id,
                      then=tuple_facts(store, target), then_id=target, gates=[],
                      requested_by=requested_by, reason=reason),
            timeout=approval_timeout,
            poll_interval=poll_interval,
        )
        if approval.decision == "rejected":
            final = rejected(approval, f"rollback of {channel}")
            create_markdown_artifact(f"# {channel}: rollback rejected\n\n{final.message}",
                                     key=f"{key}-refused",
                                     description=f"rollback of {channel}: rejected")
            return final
    actor = requested_by or (approval.who if approval else "prefect:rollback")
    result = move_back(store, channel, to=to, actor=actor, reason=reason, approval=approval)
    if isinstance(result, Refused):
        create_markdown_artifact(
            f"# {channel}: rollback {result.state_name.lower()}\n\n{result.message}\n\n"
            f"**Next:** {result.hint or 'see the run log'}\n\nNothing was written.",
            key=f"{key}-refused", description=f"rollback of {channel}: {result.state_name}")
        return end_refused(result)
    after = tuple_facts(store, result.tuple_id)
    label_run(tags(repo=after and after.repo_id, commit=after and after.commit,
                   tuple_id=result.tuple_id))
    if result.previous_tuple_id != now_id:
        before = tuple_facts(store, result.previous_tuple_id)
    facts = dict(before=before, after=after, requested_by=requested_by, reason=reason,
                 approval=approval)
    create_markdown_artifact(
        move_record("rollback", result, **facts), key=key,
        description=f"rollback of {channel} to {result.tuple_id}: who asked and approved, from "
                    f"which tuple, checks, history #{result.entry.seq}",
    )
    logger.info("%s", outcome_line("rollback", result, **facts))
    if endpoint:
        smoked = smoke_endpoint(store, endpoint, result.tuple_id, by=actor, channel=channel)
        if not smoked.passed:
            raise GateFailed(f"{channel} now points at {result.tuple_id}, but "
                             + not_ready(smoked),
                             hint="keep traffic closed; fix the endpoint and smoke it again")
    return result.model_dump(mode="json")
