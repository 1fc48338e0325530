"""A release engineer's decision, asked for as an approval request in the store.

The flow records a request through the library's one request builder
(``promotion/requests.py``, the one ``k3a promote|rollback --request-approval`` uses: what would
move, the policy in force, the flow's own identity as requester, a typed ``requested_by`` shown
as typed) and shows it as an artifact: what the channel serves now, what would replace it
(weights commit, manifest, image, profile, license sha256), the gates, and the command that
answers it, ``k3a approve REQUEST`` (``--reject`` to refuse), which the approver runs under
their own identity (the key they sign with). The flow waits for that
answer in the store; a name typed in a form or a parameter is never an approver, and separation
of duties judges the approver. The timeout fails the run and moves nothing.
"""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact
from prefect.states import Cancelled, Failed, State

from k3artifacts.policy.acting import acting
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.requests import (
    ApprovalRequest,
    Decision,
    MoveRequestPlan,
    act_move_request,
    wait_for_answer,
)
from k3artifacts.stores.base import Store

from .artifacts import sha256
from .move_records import TupleFacts, verdict


def flow_actor(store: Store) -> Acting:
    """Who the flow acts as: the identity whose key its process signs with (a worker's own key,
    ``K3A_IDENTITY_KEY``), as the store's policy names it; never a parameter."""
    return acting(store)


def _license(store: Store, facts: TupleFacts) -> str:
    manifest = store.read_manifest(facts.repo_id, facts.commit)
    if manifest is None:
        return "revision not in the store"
    digest = manifest.license.sha256
    return f"`{sha256(digest)}`" if digest else "no license file"


def _tuple_block(title: str, store: Store, facts: TupleFacts | None, fallback: str) -> str:
    # A list, not a table: the artifact pane is narrow, and a table's last column is cut off.
    if facts is None:
        return f"**{title}:** {fallback}"
    return "\n".join([
        f"**{title}:** `{facts.id}`",
        f"- weights: `{facts.weights}`",
        f"- manifest: `{sha256(facts.manifest_digest)}`",
        f"- image: `{facts.image}`",
        f"- profile: `{facts.profile}`",
        f"- license: {_license(store, facts)}",
    ])


def form_text(headline: str, store: Store, *, now: TupleFacts | None, now_id: str | None,
              then: TupleFacts | None, then_id: str | None, gates: list[GateResult],
              requested_by: str | None, reason: str | None) -> str:
    """The approval request's description: the move, both sides of it, and the gates."""
    asked = (f"Requested by **{requested_by or '(unknown)'}**"
             + (f': "{reason}"' if reason else " (no reason given)"))
    gate_lines = [f"- **{g.name}**: {verdict(g)}, {g.reason}" for g in gates] or ["- none ran"]
    return "\n\n".join([
        f"### {headline}",
        asked,
        _tuple_block("Serving now", store, now, now_id or "nothing (first promotion)"),
        _tuple_block("Would replace it", store, then, then_id or "the previous tuple"),
        "**Gates**\n" + "\n".join(gate_lines),
    ])


def ask_for_approval(store: Store, plan: MoveRequestPlan, description: str, *,
                     key: str) -> ApprovalRequest:
    """Record the planned approval request and show it, with the command that answers it."""
    request = act_move_request(store, plan)
    create_markdown_artifact(
        f"{description}\n\n**Approval request:** `{request.id}`\n\n"
        f"Approve under your own identity: `k3a approve {request.id} --store {store.url}` "
        f"(`--reject --reason ...` to refuse). A name typed anywhere else does not approve.",
        key=f"{key}-approval", description=f"approval request {request.id}: {request.subject()}")
    return request


def wait_for_approval(store: Store, request: ApprovalRequest, *, timeout: int,
                      poll_interval: int) -> Decision | State:
    """The answer recorded in the store, or the run's final state when nobody answers."""
    decision = wait_for_answer(store, request.id, timeout=timeout, poll_interval=poll_interval)
    if decision is None:
        return Failed(name="Approval timed out",
                      message=f"nobody answered {request.id} ({request.subject()}) within "
                      f"{timeout} s; nothing moved")
    return decision


def rejected(decision: Decision, what: str, *, heading: str, key: str,
             details: str = "") -> State:
    """The run's final state after a rejection: Cancelled, named Rejected. Nobody failed, and
    nothing was written; the message says who decided and why, and so does the artifact
    (``heading``, then the message, then ``details``) under the move's ``-refused`` key."""
    because = f": {decision.reason}" if decision.reason else ""
    state = Cancelled(name="Rejected",
                      message=f"{what} rejected by {decision.by.label()}{because}")
    body = f"{heading}\n\n{state.message}" + (f"\n\n{details}" if details else "")
    create_markdown_artifact(body, key=f"{key}-refused", description=f"{what}: rejected")
    return state
