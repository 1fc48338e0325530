"""Helpers for the flow tests (tests/flows)."""

from __future__ import annotations

from tests.support.hubfaults import FaultyHub


def resolve_gets(hub: FaultyHub, since: int = 0) -> list[str]:
    """Repo paths of file downloads the hub answered, in order."""
    return [r.target for r in hub.requests[since:] if "/resolve/" in r.url and r.method == "GET"]


def answer_when_paused(tag: str, run_input: dict, timeout: float = 120.0, before=None):
    """Start a thread that waits for the flow run tagged ``tag`` to pause, then resumes it with
    ``run_input``, as a release engineer's form (or script) would. Returns (thread, outcome):
    outcome gets "resumed" or the error. ``before()``, if given, runs once the run is paused,
    before the answer (to read what the paused run shows)."""
    import contextvars
    import threading
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.flow_runs import resume_flow_run

    outcome: list[object] = []

    def answer() -> None:
        deadline = time.monotonic() + timeout
        try:
            with get_client(sync_client=True) as client:
                while time.monotonic() < deadline:
                    paused = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                        tags=FlowRunFilterTags(all_=[tag]),
                        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])),
                    ))
                    if paused:
                        if before is not None:
                            before()
                        resume_flow_run(paused[0].id, run_input=run_input)
                        outcome.append("resumed")
                        return
                    time.sleep(0.2)
            outcome.append(TimeoutError(f"no paused run tagged {tag}"))
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    # The thread needs the test's Prefect settings (the API URL), which live in a contextvar.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(answer,), daemon=True)
    thread.start()
    return thread, outcome


def run_answered(flow_fn, run_input, **params):
    """Run a flow that pauses for approval, answering its form with ``run_input``."""
    import uuid

    from prefect import tags

    tag = f"test-{uuid.uuid4().hex[:12]}"
    thread, outcome = answer_when_paused(tag, run_input)
    with tags(tag):
        state = flow_fn(**params, poll_interval=1, return_state=True)
    thread.join(30)
    assert outcome == ["resumed"], outcome
    return state
