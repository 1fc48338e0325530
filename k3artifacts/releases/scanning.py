"""``k3a scan attach | ecr``: the serving image's vulnerability scan, planned, then recorded.

The plan checks who records it may sign scans (role ``scan``), resolves the tuple and reads
the scan: a Trivy or Grype report handed in (which must be of the tuple's image digest), or
ECR's findings for that digest; a refusal there writes nothing. The act records the summary
create-once beside the tuple, signed (:mod:`.scans`), for the ``image_scan`` gate.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3artifacts.policy.actor import Acting
from k3artifacts.policy.signed import require_role
from k3artifacts.releases.lookup import resolve_tuple
from k3artifacts.releases.scans import (
    ImageScan,
    ScanRecord,
    ecr_findings,
    parse_report,
    record_scan,
)
from k3artifacts.stores.awsclients import client
from k3artifacts.stores.base import Store


@dataclass(frozen=True)
class ScanPlan:
    scan: ImageScan
    by: Acting


@dataclass(frozen=True)
class Scanned:
    scan: ImageScan
    record: ScanRecord
    written: bool


def plan_scan_attach(store: Store, tuple_or_channel: str, data: bytes, source: str, *,
                     by: Acting) -> ScanPlan:
    """A Trivy or Grype JSON report of the tuple's image: RoleRefused (exit 9) for a recorder
    without the role ``scan``, ConfigError (exit 9) for another format or another image,
    NotFound (exit 7) for an unknown tuple."""
    require_role(by, "scan", "an image scan")
    release = resolve_tuple(store, tuple_or_channel)
    return ScanPlan(parse_report(release, data, source), by)


def plan_scan_ecr(store: Store, tuple_or_channel: str, *, repository: str | None,
                  region: str | None, by: Acting) -> ScanPlan:
    """ECR's findings for the tuple's image digest. ``repository`` defaults to the image's
    path after the registry, ``region`` to the registry host's (else the environment's).
    RoleRefused (exit 9) before ECR is asked, for a recorder without the role ``scan``."""
    require_role(by, "scan", "an image scan")
    release = resolve_tuple(store, tuple_or_channel)
    host, _, path = release.binding.image.repository.partition("/")
    if region is None and ".ecr." in host:
        region = host.split(".ecr.")[1].split(".")[0]
    return ScanPlan(ecr_findings(client("ecr", region=region), release, repository or path), by)


def act_scan(store: Store, plan: ScanPlan) -> Scanned:
    record, written = record_scan(store, plan.scan, by=plan.by)
    return Scanned(plan.scan, record, written)


def scan_attach(store: Store, tuple_or_channel: str, data: bytes, source: str, *,
                by: Acting) -> Scanned:
    """The attach move: :func:`plan_scan_attach`, then :func:`act_scan`."""
    return act_scan(store, plan_scan_attach(store, tuple_or_channel, data, source, by=by))


def scan_ecr(store: Store, tuple_or_channel: str, *, repository: str | None,
             region: str | None, by: Acting) -> Scanned:
    """The ECR move: :func:`plan_scan_ecr`, then :func:`act_scan`."""
    return act_scan(store, plan_scan_ecr(store, tuple_or_channel, repository=repository,
                                         region=region, by=by))
