"""A release engineer's decision, asked for by pausing the flow run with a typed input form.

The run pauses (``pause_flow_run(wait_for_input=ApprovalInput)``) and the Prefect UI shows a
form with these fields under a description of the move: what the channel serves now, what
would replace it (weights commit, manifest, image, profile, license sha256) and the gates.
``decision`` is a required choice with no default, so submitting the form untouched is an
error, not a silent rejection. A script answers with
``prefect.flow_runs.resume_flow_run(flow_run_id, run_input={"decision": "approve",
"reviewer": ..., "reason": ...})`` (Prefect has no CLI verb for it). The process stays alive
while paused, which suits approvals of minutes to hours; the timeout fails the run and moves
nothing. Prefect OSS does not authenticate who fills the form: ``reviewer`` is what they
typed, and it is recorded as such in the channel history.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.states import Cancelled, State
from pydantic import Field

from k3artifacts.releases.channels import Approval, GateResult
from k3artifacts.stores.base import Store

from .artifacts import sha256
from .move_records import TupleFacts, verdict


class ApprovalInput(RunInput):
    decision: Literal["approve", "reject"] = Field(
        description="Approve moves the channel; reject leaves it where it is")
    reviewer: str = Field(min_length=1, description="Your name, recorded in the channel history")
    reason: str = Field(default="", description="Why; recorded in the channel history")


def _license(store: Store, facts: TupleFacts) -> str:
    manifest = store.read_manifest(facts.repo_id, facts.commit)
    if manifest is None:
        return "revision not in the store"
    digest = manifest.license.sha256
    return f"`{sha256(digest)}`" if digest else "no license file"


def _tuple_block(title: str, store: Store, facts: TupleFacts | None, fallback: str) -> str:
    # A list, not a table: the form is narrow, and a table's last column is cut off there.
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
    """The form's description: the move, both sides of it, and the gates, as lists."""
    asked = (f"Requested by **{requested_by or '(unknown)'}**"
             + (f': "{reason}"' if reason else " (no reason given)"))
    gate_lines = [f"- **{g.name}**: {verdict(g)}, {g.reason}" for g in gates] or ["- none ran"]
    return "\n\n".join([
        f"### {headline}",
        asked,
        _tuple_block("Serving now", store, now, now_id or "nothing (first promotion)"),
        _tuple_block("Would replace it", store, then, then_id or "the previous tuple"),
        "**Gates**\n" + "\n".join(gate_lines),
        "Choose **approve** or **reject**; there is no default.",
    ])


def wait_for_approval(description: str, *, timeout: int, poll_interval: int) -> Approval:
    """Pause until someone answers; raises Prefect's pause timeout when nobody does."""
    answer = pause_flow_run(
        wait_for_input=ApprovalInput.with_initial_data(description=description),
        timeout=timeout,
        poll_interval=poll_interval,
    )
    return Approval(
        who=answer.reviewer,
        decision="approved" if answer.decision == "approve" else "rejected",
        reason=answer.reason or None,
        when=datetime.now(UTC),
    )


def rejected(approval: Approval, what: str) -> State:
    """The run's final state after a rejection: Cancelled, named Rejected. Nobody failed, and
    nothing was written; the message says who decided and why."""
    because = f": {approval.reason}" if approval.reason else ""
    return Cancelled(name="Rejected", message=f"{what} rejected by {approval.who}{because}")
