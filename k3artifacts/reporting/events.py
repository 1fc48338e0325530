"""What an operator is told about without watching: the pipeline's notification vocabulary.

Each happening is a :class:`Notification`: a stable event name, the resource it is about (a
revision or a channel), related resources (the tuple, the channel) and a JSON payload. The
library only builds them; the flows emit them as Prefect events (``flows/notify.py``), and a
Prefect automation matching them forwards them to a webhook or Slack (README, "Notifications").

Names, resource ids and payload keys are an interface: automations and dashboards match on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from k3artifacts.errors import ReleaseRefused

UPSTREAM_FOUND = "k3a.revision.upstream-found"
#: Staged: verified and published in the store (and bound into a tuple when one was asked for).
PUBLISHED = "k3a.revision.published"
REFUSED = "k3a.revision.refused"
PROMOTION_BLOCKED = "k3a.promotion.blocked"
PROMOTED = "k3a.channel.promoted"
ROLLED_BACK = "k3a.channel.rolled-back"
READINESS_FAILED = "k3a.readiness.failed"

#: Every event name, for an automation's ``expect`` list.
EVENTS = (UPSTREAM_FOUND, PUBLISHED, REFUSED, PROMOTION_BLOCKED, PROMOTED, ROLLED_BACK,
          READINESS_FAILED)


@dataclass(frozen=True)
class Notification:
    event: str
    #: Prefect's resource labels: ``prefect.resource.id`` plus what a filter may match on.
    resource: dict[str, str]
    payload: dict[str, Any] = field(default_factory=dict)
    #: Prefect's related resources, each with a ``prefect.resource.role`` (tuple, channel).
    related: list[dict[str, str]] = field(default_factory=list)


def tuple_resource_id(tuple_id: str) -> str:
    return f"k3a.tuple.{tuple_id}"


def channel_resource_id(channel: str) -> str:
    return f"k3a.channel.{channel}"


def _tuple(tuple_id: str) -> dict[str, str]:
    return {"prefect.resource.id": tuple_resource_id(tuple_id),
            "prefect.resource.name": tuple_id, "prefect.resource.role": "tuple"}


def _channel(channel: str, tuple_id: str) -> dict[str, str]:
    return {"prefect.resource.id": channel_resource_id(channel),
            "prefect.resource.name": channel, "k3a.tuple": tuple_id}


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
        [_tuple(tuple_id)] if tuple_id else [],
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
        _channel(channel, tuple_id),
        {
            "tuple_id": tuple_id,
            "channel": channel,
            "failed_gates": dict(sorted(failed_gates.items())),
            "requested_by": requested_by,
        },
        [_tuple(tuple_id)],
    )


def _moved(event: str, channel: str, tuple_id: str, *, previous_tuple_id: str | None, seq: int,
           who: str, why: str | None) -> Notification:
    return Notification(
        event,
        _channel(channel, tuple_id),
        {"tuple_id": tuple_id, "channel": channel, "previous_tuple_id": previous_tuple_id,
         "history_seq": seq, "who": who, "why": why},
        [_tuple(tuple_id)],
    )


def channel_promoted(channel: str, tuple_id: str, *, previous_tuple_id: str | None, seq: int,
                     who: str, why: str | None) -> Notification:
    """``channel`` now points at ``tuple_id`` (history entry ``seq``)."""
    return _moved(PROMOTED, channel, tuple_id, previous_tuple_id=previous_tuple_id, seq=seq,
                  who=who, why=why)


def channel_rolled_back(channel: str, tuple_id: str, *, previous_tuple_id: str | None, seq: int,
                        who: str, why: str | None) -> Notification:
    """``channel`` was pointed back at ``tuple_id``, a tuple it served before."""
    return _moved(ROLLED_BACK, channel, tuple_id, previous_tuple_id=previous_tuple_id, seq=seq,
                  who=who, why=why)


def readiness_failed(tuple_id: str, channel: str | None, *, endpoint: str, kind: str,
                     failed: Mapping[str, str], report_sha256: str) -> Notification:
    """A smoke or eval run of ``endpoint`` for ``tuple_id`` ended NOT READY (``failed``: check
    or problem -> detail); the report is stored beside the tuple."""
    resource = {"prefect.resource.id": tuple_resource_id(tuple_id),
                "prefect.resource.name": tuple_id, "k3a.endpoint": endpoint}
    related = [{"prefect.resource.id": channel_resource_id(channel),
                "prefect.resource.name": channel, "prefect.resource.role": "channel"}
               ] if channel else []
    return Notification(
        READINESS_FAILED,
        resource,
        {"tuple_id": tuple_id, "channel": channel, "endpoint": endpoint, "kind": kind,
         "failed": dict(failed), "report_sha256": report_sha256},
        related,
    )
