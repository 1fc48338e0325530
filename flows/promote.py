"""Flow ``promote``: gates, then a release engineer's approval record, then the pointer.

    plan the approval request (the library's one builder, ``promotion/requests.py``: the
    promotion's gates by the store's policy, nothing written) -> fail now if a gate fails and
    is not overridden -> smoke the ``endpoint`` serving the tuple, when given (report stored,
    artifact shown; not ready: the run ends "Blocked by gate", nothing moves) -> record the
    request and wait for its answer in the store (``k3a approve REQUEST``, under the
    approver's own identity) -> promote(): planned again with the approver as the promoter,
    then a compare-and-swap of the pointer; the approval is recorded in the history entry

Rejection writes nothing and ends the run Cancelled, named "Rejected". A failing gate ends it
Failed, named "Blocked by gate", and a move beaten by another one "Lost race": decisions, logged
in one line without a traceback (:mod:`flows.decisions`). The gates run again after approval
because the wait can be long: a review withdrawn meanwhile still blocks.
The same move without Prefect: ``k3a promote TUPLE CHANNEL --request-approval``, then
``k3a promote TUPLE CHANNEL --approval REQUEST``.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import State

from k3artifacts.errors import GatesRefused
from k3artifacts.policy.results import GateResult, policy_label
from k3artifacts.promotion.moves import MoveResult, promote
from k3artifacts.promotion.requests import MoveRequestPlan, plan_move_request
from k3artifacts.reporting import events
from k3artifacts.stores.base import Store

from .approval import ask_for_approval, flow_actor, form_text, rejected, wait_for_approval
from .common import slug, store_from
from .decisions import BLOCKED, DECISIONS, Refused, end_refused
from .logs import quiet_task_completions
from .move_records import gate_table, move_record, outcome_line, tuple_facts
from .naming import label_run, promote_name, tags
from .notify import failed_gates, notify
from .readiness import not_ready, smoke_endpoint

__all__ = ["gate_table", "promote_release"]


@task(name="check-gates", cache_policy=NO_CACHE, persist_result=False)
def plan_request(store: Store, tuple_id: str, channel: str, *, overrides: dict[str, str],
                 requested_by: str | None,
                 reason: str | None) -> MoveRequestPlan | tuple[Refused, list[GateResult]]:
    """The approval request's plan: the gates, judged for nobody yet (separation of duties
    is judged on the approver, by the move). A gate refusal comes back as values, with the
    whole table: a raising task would log its traceback."""
    try:
        return plan_move_request(store, "promote", channel, tuple_id=tuple_id,
                                 overrides=overrides, requested_by=flow_actor(store),
                                 requested_for=requested_by, why=reason)
    except GatesRefused as exc:
        return Refused.of(exc), exc.report.results
    except DECISIONS as exc:
        return Refused.of(exc), []


@task(name="move-pointer", cache_policy=NO_CACHE, persist_result=False)
def move_pointer(store: Store, tuple_id: str, channel: str, *, reason: str | None,
                 overrides: dict[str, str], approval: str | None) -> MoveResult | Refused:
    try:
        return promote(store, tuple_id, channel, acting=flow_actor(store), reason=reason,
                       overrides=overrides, approval=approval)
    except DECISIONS as exc:
        return Refused.of(exc)


@flow(name="promote", flow_run_name=promote_name, persist_result=False)
def promote_release(
    tuple_id: str,
    channel: str = "staging",
    store_url: str | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
    overrides: dict[str, str] | None = None,
    approval_timeout: int = 24 * 3600,
    poll_interval: int = 10,
    endpoint: str | None = None,
):
    """Move ``channel`` onto ``tuple_id`` once its gates pass and a release engineer approves.

    The gates are the store's policy. ``requested_by`` is shown to the approver as typed; it is
    never an identity (the approver's record is).
    ``overrides``: gate name -> reason, for a failed gate someone decided to accept (recorded).
    ``endpoint``: an OpenAI-compatible URL serving ``tuple_id`` (a canary): smoke-tested before
    anyone is asked to approve.
    ``approval_timeout``: seconds to wait for the decision before failing (nothing moves).
    """
    quiet_task_completions()
    logger = get_run_logger()
    store = store_from(store_url)
    overrides = overrides or {}
    after = tuple_facts(store, tuple_id)
    label_run(tags(repo=after and after.repo_id, commit=after and after.commit,
                   tuple_id=tuple_id, channel=channel))
    key = slug("k3a-promote", channel)
    planned = plan_request(store, tuple_id, channel, overrides=overrides,
                           requested_by=requested_by, reason=reason)
    if isinstance(planned, tuple):
        refused, results = planned
        if refused.state_name == BLOCKED:
            notify(events.promotion_blocked(tuple_id, channel, failed_gates(results),
                                            requested_by=requested_by))
        _refusal_artifact(refused, f"{tuple_id} -> {channel}", gate_table(results),
                          requested_by, reason, key)
        return end_refused(refused)
    table = (gate_table(planned.gates)
             + f"\n\npolicy: {policy_label(planned.policy_version, planned.policy_digest)}")
    if endpoint:
        smoked = smoke_endpoint(store, endpoint, tuple_id, channel=channel)
        if not smoked.passed:
            refused = Refused(BLOCKED, not_ready(smoked), "fix the endpoint, then run again")
            notify(events.promotion_blocked(tuple_id, channel, {"smoke": refused.message},
                                            requested_by=requested_by))
            _refusal_artifact(refused, f"{tuple_id} -> {channel}", table, requested_by, reason,
                              key)
            return end_refused(refused)
        knee = smoked.sweep.knee if smoked.sweep else None
        table += f"\n\nsmoke of {endpoint}: ready (throughput knee at concurrency {knee})"
    before_id = planned.serving
    before = tuple_facts(store, before_id)
    # A channel already on the tuple: the move changes nothing, so nobody is asked.
    approval = None
    if not planned.unchanged:
        request = ask_for_approval(
            store, planned,
            form_text(f"Promote {tuple_id} to {channel}", store, now=before, now_id=before_id,
                      then=after, then_id=tuple_id, gates=planned.gates,
                      requested_by=requested_by, reason=reason),
            key=key)
        logger.info("gates pass for %s -> %s; waiting for `k3a approve %s`", tuple_id, channel,
                    request.id)
        decision = wait_for_approval(store, request, timeout=approval_timeout,
                                     poll_interval=poll_interval)
        if isinstance(decision, State):
            return decision
        if decision.decision == "rejected":
            return rejected(decision, f"promotion of {tuple_id} to {channel}",
                            heading=f"# {tuple_id} -> {channel}: rejected", key=key,
                            details=f"{channel} was not changed.\n\n{table}")
        approval = request.id
    result = move_pointer(store, tuple_id, channel, reason=reason, overrides=overrides,
                          approval=approval)
    if isinstance(result, Refused):
        if result.state_name == BLOCKED:
            notify(events.promotion_blocked(tuple_id, channel, {"gates": result.message},
                                            requested_by=requested_by))
        _refusal_artifact(result, f"{tuple_id} -> {channel}", table, requested_by, reason, key)
        return end_refused(result)
    if result.previous_tuple_id != before_id:  # moved meanwhile: record what it really replaced
        before = tuple_facts(store, result.previous_tuple_id)
    facts = dict(before=before, after=after, requested_by=requested_by, reason=reason,
                 approval=result.entry.approval)
    create_markdown_artifact(
        move_record("promote", result, **facts), key=key,
        description=f"promotion of {channel} to {tuple_id}: who asked and approved, from which "
                    f"tuple, gates, history #{result.entry.seq}",
    )
    logger.info("%s", outcome_line("promote", result, **facts))
    if result.changed:
        notify(events.channel_promoted(
            channel, tuple_id, previous_tuple_id=result.previous_tuple_id, seq=result.entry.seq,
            who=result.entry.who, why=result.entry.why))
    return result.model_dump(mode="json")


def _refusal_artifact(refused: Refused, move: str, table: str, requested_by: str | None,
                      reason: str | None, key: str) -> None:
    """A refused move's artifact, under its own key: the channel's record key keeps showing
    the last move that happened."""
    asked = f"{requested_by or '(unknown)'}" + (f' ("{reason}")' if reason else "")
    create_markdown_artifact(
        f"# {move}: {refused.state_name.lower()}\n\n{refused.message}\n\n"
        f"**Next:** {refused.hint or 'see the run log'}\n\nRequested by {asked}. "
        f"Nothing was written.\n\n{table}",
        key=f"{key}-refused",
        description=f"{move}: {refused.state_name.lower()}, nothing moved",
    )
