"""Flow ``rollback``: point a channel back at a tuple it served before; no weight byte moves.

Approval is the store's policy (``rollback_approval``), which the library enforces for every
caller; ``require_approval`` can ask for one where the policy does not: a rollback is usually an
incident response, so by default it does not wait. The flow plans the approval request first
(the library's one builder, ``promotion/requests.py``: the target decided once, its weights
checked); when an approval is wanted it records the request and waits for its answer in the
store (``k3a approve REQUEST``, under the approver's
own identity); the decision is recorded in the history entry like a promotion's, and a
rejection writes nothing and ends the run Cancelled, named "Rejected". A
rollback beaten by a concurrent move ends Failed, named "Lost race" (:mod:`flows.decisions`).
With ``endpoint`` (the URL serving the channel once its render is re-applied), the smoke suite
runs after the move; the run fails when the endpoint is not ready: do not reopen traffic.
The same move without Prefect: ``k3a rollback CHANNEL [--to TUPLE] [--request-approval]``.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from k3artifacts.errors import GateFailed
from k3artifacts.promotion.moves import MoveResult
from k3artifacts.promotion.requests import MoveRequestPlan, plan_move_request
from k3artifacts.promotion.rollback import rollback
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
        return rollback(store, channel, to=to, acting=flow_actor(store), reason=reason,
                        approval=approval)
    except DECISIONS as exc:
        return Refused.of(exc)


@task(name="plan-rollback", cache_policy=NO_CACHE, persist_result=False)
def plan_request(store: Store, channel: str, *, to: str | None, requested_by: str | None,
                 reason: str | None) -> MoveRequestPlan | Refused:
    """The rollback's approval request as planned (its target fixed now, so an approval
    answers exactly this move), whether or not one is then asked for."""
    try:
        return plan_move_request(store, "rollback", channel, tuple_id=to,
                                 requested_by=flow_actor(store), requested_for=requested_by,
                                 why=reason)
    except DECISIONS as exc:
        return Refused.of(exc)


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
    key = slug("k3a-rollback", channel)
    planned = plan_request(store, channel, to=to, requested_by=requested_by, reason=reason)
    if isinstance(planned, Refused):
        return _refused(planned, channel, key)
    to, now_id = planned.tuple_id, planned.serving
    before = tuple_facts(store, now_id)
    request_id = None
    if (require_approval or planned.required) and not planned.unchanged:
        request = ask_for_approval(
            store, planned,
            form_text(f"Roll {channel} back", store, now=before, now_id=now_id,
                      then=tuple_facts(store, to), then_id=to, gates=planned.gates,
                      requested_by=requested_by, reason=reason),
            key=key)
        decision = wait_for_approval(store, request, timeout=approval_timeout,
                                     poll_interval=poll_interval)
        if isinstance(decision, State):
            return decision
        if decision.decision == "rejected":
            return rejected(decision, f"rollback of {channel}",
                            heading=f"# {channel}: rollback rejected", key=key)
        request_id = request.id
    result = move_back(store, channel, to=to, reason=reason, approval=request_id)
    if isinstance(result, Refused):
        return _refused(result, channel, key)
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
        smoked = smoke_endpoint(store, endpoint, result.tuple_id, channel=channel)
        if not smoked.passed:
            raise GateFailed(f"{channel} now points at {result.tuple_id}, but "
                             + not_ready(smoked),
                             hint="keep traffic closed; fix the endpoint and smoke it again")
    return result.model_dump(mode="json")


def _refused(refused: Refused, channel: str, key: str) -> State:
    create_markdown_artifact(
        f"# {channel}: rollback {refused.state_name.lower()}\n\n{refused.message}\n\n"
        f"**Next:** {refused.hint or 'see the run log'}\n\nNothing was written.",
        key=f"{key}-refused", description=f"rollback of {channel}: {refused.state_name}")
    return end_refused(refused)
