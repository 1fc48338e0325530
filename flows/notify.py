"""The flows' one way to tell operators: the library's notifications, emitted as Prefect events.

The library builds each :class:`~k3artifacts.reporting.events.Notification` (names, resources,
payload) and imports no Prefect; here it becomes an event on the run's Prefect API, where an
automation (README, "Notifications") forwards it.
"""

from __future__ import annotations

from collections.abc import Iterable

from prefect.events import emit_event

from k3artifacts.releases.channels import GateResult
from k3artifacts.reporting.events import Notification


def notify(notification: Notification) -> None:
    emit_event(event=notification.event, resource=notification.resource,
               related=notification.related, payload=notification.payload)


def failed_gates(results: Iterable[GateResult]) -> dict[str, str]:
    """Gate -> reason for the gates that failed and were not overridden."""
    return {r.name: r.reason for r in results if not r.passed and not r.overridden}
