"""Helpers for the flow tests (tests/flows)."""

from __future__ import annotations

from tests.support.hubfaults import FaultyHub


def resolve_gets(hub: FaultyHub, since: int = 0) -> list[str]:
    """Repo paths of file downloads the hub answered, in order."""
    return [r.target for r in hub.requests[since:] if "/resolve/" in r.url and r.method == "GET"]


def answer_when_requested(store_url: str, run_input: dict, timeout: float = 120.0, before=None):
    """Start a thread that waits for a flow's approval request to appear in the store, then
    answers it as a release engineer running `k3a approve` would: ``run_input["reviewer"]``
    is the approver (a person of tests/fixtures/people.py, signing with its key),
    ``decision`` approve or reject, ``reason``. Returns
    (thread, outcome): outcome gets the request id or the error. ``before(request)``, if
    given, runs once the request is there, before the answer."""
    import threading

    from k3artifacts.policy.approvals import PREFIX, get_request
    from k3artifacts.policy.decide import decide
    from k3artifacts.stores.registry import open_store
    from tests.fixtures.people import person
    from tests.support.waiting import wait_until

    store = open_store(store_url)
    outcome: list[object] = []

    def pending() -> list[str]:
        keys = store.list_keys(PREFIX)
        return [k.split("/")[-2] for k in keys if k.endswith("/request.json")
                and k.replace("request.json", "decision.json") not in keys]

    def answer() -> None:
        try:
            waiting = wait_until(pending, f"an approval request in {store_url}", timeout,
                                 interval=0.2)
            request = get_request(store, waiting[0])
            if before is not None:
                before(request)
            decide(store, request.id,
                   by=person(run_input["reviewer"]),
                   approve=run_input["decision"] == "approve",
                   reason=run_input.get("reason") or None)
            outcome.append(request.id)
        except Exception as exc:  # noqa: BLE001 - handed to the test (a timeout included)
            outcome.append(exc)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread, outcome


def run_answered(flow_fn, run_input, **params):
    """Run a flow that waits for approval, answering its request with ``run_input``."""
    thread, outcome = answer_when_requested(params["store_url"], run_input)
    state = flow_fn(**params, poll_interval=1, return_state=True)
    thread.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], str), outcome
    return state
