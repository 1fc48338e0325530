"""A release engineer's decision, asked for by pausing the flow run with a typed input form.

The run pauses (``pause_flow_run(wait_for_input=ApprovalInput)``) and the Prefect UI shows a
form with these fields; a script answers with
``prefect.flow_runs.resume_flow_run(flow_run_id, run_input={"approve": true, "reviewer": ...,
"reason": ...})`` (Prefect has no CLI verb for it). The process stays alive while paused, which
suits approvals of minutes to hours; the timeout fails the run and moves nothing.
Prefect OSS does not authenticate who fills the form: ``reviewer`` is what they typed, and it
is recorded as such in the channel history.
"""

from __future__ import annotations

from datetime import UTC, datetime

from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.states import Cancelled, State
from pydantic import Field

from k3artifacts.releases.channels import Approval


class ApprovalInput(RunInput):
    approve: bool
    reviewer: str = Field(min_length=1, description="Your name, recorded in the channel history")
    reason: str = Field(default="", description="Why; recorded in the channel history")


def wait_for_approval(description: str, *, timeout: int, poll_interval: int) -> Approval:
    """Pause until someone answers; raises Prefect's pause timeout when nobody does."""
    answer = pause_flow_run(
        wait_for_input=ApprovalInput.with_initial_data(description=description),
        timeout=timeout,
        poll_interval=poll_interval,
    )
    return Approval(
        who=answer.reviewer,
        decision="approved" if answer.approve else "rejected",
        reason=answer.reason or None,
        when=datetime.now(UTC),
    )


def rejected(approval: Approval, what: str) -> State:
    """The run's final state after a rejection: Cancelled, named Rejected. Nobody failed, and
    nothing was written; the message says who decided and why."""
    because = f": {approval.reason}" if approval.reason else ""
    return Cancelled(name="Rejected", message=f"{what} rejected by {approval.who}{because}")
