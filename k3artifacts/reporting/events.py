"""What an operator is told about without watching: the pipeline's notification vocabulary.

Four happenings, each a :class:`Notification` with a stable event name, the resource it is
about and a JSON payload. The library only builds them (it never imports Prefect); the flows
emit them as Prefect events, and a Prefect automation matching ``k3a.*`` forwards them to a
webhook or Slack (README, "Notifications")::

    from prefect.events import emit_event
    n = revision_refused("moonshotai/Kimi-K3", commit, exc)
    emit_event(event=n.event, resource=n.resource, payload=n.payload)

Names and payload keys are an interface: automations and dashboards match on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from k3artifacts.errors import ReleaseRefused

UPSTREAM_FOUND = "k3a.revision.upstream-found"
PUBLISHED = "k3a.revision.published"
REFUSED = "k3a.revision.refused"
PROMOTION_BLOCKED = "k3a.promotion.blocked"

#: Every event name, for an automation's ``expect`` list.
EVENTS = (UPSTREAM_FOUND, PUBLISHED, REFUSED, PROMOTION_BLOCKED)


@dataclass(frozen=True)
class Notification:
    event: str
    #: Prefect's resource labels: ``prefect.resource.id`` plus what a filter may match on.
    resource: dict[str, str]
    payload: dict[str, Any] = field(default_factory=dict)


def _revision_resource(repo_id: str, commit: str) -> dict[str, str]:
    return {
        "prefect.resource.id": f"k3a.revision.{repo_id}@{commit}",
        "prefect.resource.name": f"{repo_id}@{commit[:12]}",
        "k3a.repo": repo_id,
    }


def upstream_revision_found(repo_id: str, branch: str, commit: str) -> Notification:
    """The watcher saw a head of ``branch`` that is not published yet (and starts staging)."""
    return Notification(
        UPSTREAM_FOUND,
        _revision_resource(repo_id, commit),
        {"repo_id": repo_id, "branch": branch, "commit": commit},
    )


def revision_published(
    repo_id: str,
    commit: str,
    *,
    manifest_digest: str,
    location: str,
    files: int,
    total_bytes: int,
    remote_code: Iterable[str] = (),
    tuple_id: str | None = None,
) -> Notification:
    """A revision is in the store, verified, manifest written (a ``StageResult``'s fields)."""
    return Notification(
        PUBLISHED,
        _revision_resource(repo_id, commit),
        {
            "repo_id": repo_id,
            "commit": commit,
            "manifest_digest": manifest_digest,
            "location": location,
            "files": files,
            "total_bytes": total_bytes,
            "remote_code": sorted(remote_code),
            "tuple_id": tuple_id,
        },
    )


def revision_refused(repo_id: str, commit: str, refused: ReleaseRefused) -> Notification:
    """Staging refused the revision; nothing was published. ``why`` is one line per file."""
    return Notification(
        REFUSED,
        _revision_resource(repo_id, commit),
        {
            "repo_id": repo_id,
            "commit": commit,
            "why": [f"{r.path}: [{r.rule}] {r.detail}" for r in refused.refusals],
            "rules": sorted({r.rule for r in refused.refusals}),
        },
    )


def promotion_blocked(
    tuple_id: str, channel: str, failed_gates: Mapping[str, str], *, requested_by: str | None
) -> Notification:
    """A move onto ``channel`` was refused by its gates (``failed_gates``: gate -> reason)."""
    return Notification(
        PROMOTION_BLOCKED,
        {
            "prefect.resource.id": f"k3a.channel.{channel}",
            "prefect.resource.name": channel,
            "k3a.tuple": tuple_id,
        },
        {
            "tuple_id": tuple_id,
            "channel": channel,
            "failed_gates": dict(sorted(failed_gates.items())),
            "requested_by": requested_by,
        },
    )
