"""Flow ``refresh-freshness``: re-sign the store's freshness head on a schedule (daily in
prefect.yaml / ``python -m flows.serve``), so readers keep trusting a live store between moves
and refuse a frozen copy of it once the lifetime its policy sets has passed
(docs/policy-and-identity.md, "Freshness"). The worker signs with its own key
(``K3A_IDENTITY_KEY``): a root identity's, or better one holding only ``freshness``.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from k3artifacts.releases.freshness import refresh
from k3artifacts.trust.keys import identity_signer

from .common import store_from
from .logs import quiet_task_completions


@flow(name="refresh-freshness", persist_result=False)
def refresh_freshness(store_url: str | None = None) -> str:
    """Verify every history of the store, then re-sign its freshness head; returns until
    when it holds."""
    quiet_task_completions()
    store = store_from(store_url)
    fresh = refresh(store, identity_signer(create=False).signer)
    until = f"{fresh.expires:%Y-%m-%d %H:%M} UTC"
    get_run_logger().info("refreshed %s until %s (%d channel(s))", store.url, until,
                          len(fresh.channels))
    return until
