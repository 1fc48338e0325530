"""Flow ``rollback``: point a channel back at a tuple it served before; no weight byte moves.

Approval is the store's policy (``rollback_approval``), which the library enforces for every
caller; ``require_approval`` can ask for one where the policy does not: a rollback is usually an
incident response, so by default it does not wait. When it does, the flow records an approval
request and waits for its answer in the store (``k3a approve REQUEST``, under the approver's
own identity); the decision is recorded in the history entry like a promotion's, and a
rejection writes nothing and ends the run Cancelled, named "Rejected". A
rollback beaten by a concurrent move ends Failed, named "Lost race" (:mod:`flows.decisions`).
With ``endpoint`` (the URL serving the channel once its render is re-applied), the smoke suite
runs after the move; the run fails when the endpoint is not ready: do not reopen traffic.
The same move without Prefect: ``k3a rollback CHANNEL [--to TUPLE]``.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from k3artifacts.errors import GateFailed
from k3artifacts.policy.record import in_force
from k3artifacts.promotion.moves import MoveResult, rollback
from k3artifacts.releases.channels import iter_history_reversed, read_state
from k3artifacts.reporting import events
from k3artifacts.stores.base import Store

from .approval import ask_for_approval, flow_actor, form_text, rejected, wait_for_approval
from .common import slug, store_from
from .decisions import DECISIONS, Refused, end_refused
from .logs import quiet_task_completions
from .move_records import move_record, outcome_line, tuple_facts
from .naming import label_run, rollback_name, tags
from .notify import notify
from .readiness import not_ready, smoke_endpoint


@task(name="move-pointer-back", cache_policy=NO_CACHE, persist_result=False)
def move_back(store: Store, channel: str, *, to: str | None, reason: str | None,
              approval: str | None) -> MoveResult | Refused:
    try:
        return rollback(store, channel, to=to, actor=flow_actor(store), reason=reason,
                        approval=approval)
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
    label_run(tags(channel=channel, tuple_id=to))
    chan = in_force(store).document.gates.channels.get(channel)
    require_approval = bool(require_approval or (chan and chan.rollback_approval))
    request_id = None
    key = slug("k3a-rollback", channel)
    now_id = read_state(store, channel).tuple_id
    before = tuple_facts(store, now_id)
    if require_approval:
        # The target is fixed now, so the approval answers exactly this move.
        to = to or _default_target(store, channel)
        request = ask_for_approval(
            store,
            form_text(f"Roll {channel} back", store, now=before, now_id=now_id,
                      then=tuple_facts(store, to), then_id=to, gates=[],
                      requested_by=requested_by, reason=reason),
            action="rollback", channel=channel, tuple_id=to, requested_by=requested_by,
            reason=reason, key=key)
        decision = wait_for_approval(store, request, timeout=approval_timeout,
                                     poll_interval=poll_interval)
        if isinstance(decision, State):
            return decision
        if decision.decision == "rejected":
            final = rejected(decision, f"rollback of {channel}")
            create_markdown_artifact(f"# {channel}: rollback rejected\n\n{final.message}",
                                     key=f"{key}-refused",
                                     description=f"rollback of {channel}: rejected")
            return final
        request_id = request.id
    result = move_back(store, channel, to=to, reason=reason, approval=request_id)
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
                 approval=result.entry.approval)
    create_markdown_artifact(
        move_record("rollback", result, **facts), key=key,
        description=f"rollback of {channel} to {result.tuple_id}: who asked and approved, from "
                    f"which tuple, checks, history #{result.entry.seq}",
    )
    logger.info("%s", outcome_line("rollback", result, **facts))
    if result.changed:
        notify(events.channel_rolled_back(channel, result.tuple_id,
                                          previous_tuple_id=result.previous_tuple_id,
                                          seq=result.entry.seq, who=result.entry.who,
                                          why=result.entry.why))
    if endpoint:
        smoked = smoke_endpoint(store, endpoint, result.tuple_id, by=result.entry.who,
                                channel=channel)
        if not smoked.passed:
            raise GateFailed(f"{channel} now points at {result.tuple_id}, but "
                             + not_ready(smoked),
                             hint="keep traffic closed; fix the endpoint and smoke it again")
    return result.model_dump(mode="json")
