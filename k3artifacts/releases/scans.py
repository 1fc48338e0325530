"""Vulnerability scans of a tuple's serving image, recorded with the tuple for the
``image_scan`` gate: a Trivy or Grype JSON report (``k3a scan attach``) or ECR's own scan
findings (``k3a scan ecr``). A report must be of the tuple's image digest; its findings are
summarised by severity, the critical ones named.

Stored create-once under ``releases/scans/<tuple-id>/<sha256 of the canonical summary>.json``,
a signed record of the identity that scanned (role ``scan``, ``policy/signed.py``), read only
through that signature: a scan written by hand is refused by name (UntrustedRecord, exit 4).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict

from k3artifacts.canonical import canonical_digest
from k3artifacts.errors import ConfigError, NotFound, UntrustedRecord
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.signed import Family, RecordTrust
from k3artifacts.releases.records import create_record, read_records
from k3artifacts.releases.tuples import ReleaseTuple, TupleStore, check_tuple_id
from k3artifacts.stores.awsclients import aws_errors, error_code
from k3artifacts.stores.records import RecordStore

SCANS_PREFIX = "releases/scans/"
SEVERITIES = ("CRITICAL", "HIGH", "MEDIUM", "LOW", "UNKNOWN")


class ImageScan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    tuple_id: str
    image_digest: str
    scanner: Literal["trivy", "grype", "ecr"]
    scanner_version: str | None = None
    #: Findings per severity (CRITICAL, HIGH, MEDIUM, LOW, UNKNOWN).
    counts: dict[str, int]
    #: The critical findings' ids (CVE/GHSA), sorted, unique.
    critical: list[str]


class ScanRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    scan_sha256: str
    #: The identity whose key signed the record (the reader checks they agree).
    recorded_by: str
    recorded_at: datetime
    scan: ImageScan


SCANS = Family(SCANS_PREFIX, "scan", ScanRecord, "recorded_by")


def _severity(value: Any) -> str:
    text = str(value or "UNKNOWN").upper()
    return text if text in SEVERITIES else ("LOW" if text in ("NEGLIGIBLE", "INFORMATIONAL")
                                            else "UNKNOWN")


def _summary(release: ReleaseTuple, scanner: str, version: str | None,
             findings: list[tuple[str, str]]) -> ImageScan:
    counts = dict.fromkeys(SEVERITIES, 0)
    for _, severity in findings:
        counts[severity] += 1
    return ImageScan(tuple_id=release.id, image_digest=release.binding.image.digest,
                     scanner=scanner,  # type: ignore[arg-type]
                     scanner_version=version, counts=counts,
                     critical=sorted({i for i, s in findings if s == "CRITICAL"}))


def parse_report(release: ReleaseTuple, data: bytes, source: str) -> ImageScan:
    """A Trivy (``SchemaVersion`` 2) or Grype JSON report of the tuple's image, summarised."""
    digest = release.binding.image.digest
    try:
        report = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"scan report {source} is not JSON: {exc}") from None
    if not isinstance(report, dict):
        raise ConfigError(f"scan report {source} is not a JSON object")
    if "SchemaVersion" in report and "Results" in report:
        meta = report.get("Metadata") or {}
        digests = [str(d) for d in meta.get("RepoDigests") or []]
        findings = [(str(v.get("VulnerabilityID")), _severity(v.get("Severity")))
                    for r in report.get("Results") or [] for v in r.get("Vulnerabilities") or []]
        scanner, version = "trivy", None
    elif "matches" in report and "source" in report:
        target = (report.get("source") or {}).get("target") or {}
        digests = [str(d) for d in [target.get("manifestDigest"), *(target.get("repoDigests")
                                                                      or [])] if d]
        findings = [(str((m.get("vulnerability") or {}).get("id")),
                     _severity((m.get("vulnerability") or {}).get("severity")))
                    for m in report.get("matches") or []]
        scanner, version = "grype", (report.get("descriptor") or {}).get("version")
    else:
        raise ConfigError(f"scan report {source} is neither Trivy's nor Grype's JSON",
                          hint="trivy image --format json IMAGE@DIGEST, or "
                          "grype IMAGE@DIGEST -o json")
    if not any(d == digest or d.endswith("@" + digest) for d in digests):
        raise ConfigError(
            f"scan report {source} is of {', '.join(digests) or 'an image with no digest'}, "
            f"not the tuple's image {release.binding.image.reference}",
            hint=f"scan {release.binding.image.reference} by its digest")
    return _summary(release, scanner, version, findings)


def ecr_findings(ecr: Any, release: ReleaseTuple, repository: str) -> ImageScan:
    """ECR's scan findings (basic or enhanced) for the tuple's image digest, all pages."""
    digest = release.binding.image.digest
    findings: list[tuple[str, str]] = []
    pages = ecr.get_paginator("describe_image_scan_findings").paginate(
        repositoryName=repository, imageId={"imageDigest": digest})
    with aws_errors(f"ECR scan findings of {repository}@{digest}"):
        try:
            pages = list(pages)
        except ClientError as exc:
            if error_code(exc) != "ScanNotFoundException":
                raise
            raise NotFound(f"ECR has no scan of {repository}@{digest}",
                           hint=f"scan it first: aws ecr start-image-scan --repository-name "
                           f"{repository} --image-id imageDigest={digest}") from None
    for page in pages:
        status = (page.get("imageScanStatus") or {}).get("status")
        if status not in (None, "COMPLETE", "ACTIVE"):
            raise ConfigError(f"ECR scan of {repository}@{digest} is {status}",
                              hint="wait for the scan to complete, then run again")
        body = page.get("imageScanFindings") or {}
        findings += [(str(f.get("name")), _severity(f.get("severity")))
                     for f in body.get("findings") or []]
        findings += [(str((f.get("packageVulnerabilityDetails") or {}).get("vulnerabilityId")
                          or f.get("title")), _severity(f.get("severity")))
                     for f in body.get("enhancedFindings") or []]
    return _summary(release, "ecr", None, findings)


def record_scan(store: RecordStore, scan: ImageScan, *, by: Acting,
                now: datetime | None = None) -> tuple[ScanRecord, bool]:
    """Store ``scan`` beside its tuple, signed by ``by``; returns (record, written)."""
    TupleStore(store).get(scan.tuple_id)
    sha = canonical_digest(scan.model_dump(mode="json"))
    key = f"{SCANS_PREFIX}{check_tuple_id(scan.tuple_id)}/{sha}.json"
    record = ScanRecord(scan_sha256=sha, recorded_by=by.name,
                        recorded_at=now or datetime.now(UTC), scan=scan)
    return create_record(store, key, SCANS, record, tuple_id=scan.tuple_id, by=by)


def list_scans(store: RecordStore, tuple_id: str, *,
               trust: RecordTrust | None = None) -> list[ScanRecord]:
    """The scans recorded for ``tuple_id``, oldest first, each verified (``trust``: the
    store's policy in force unless given)."""
    records = []
    prefix = f"{SCANS_PREFIX}{check_tuple_id(tuple_id)}/"
    for key, record in read_records(store, prefix, SCANS, tuple_id=tuple_id, trust=trust):
        sha = canonical_digest(record.scan.model_dump(mode="json"))
        if (sha != record.scan_sha256 or record.scan.tuple_id != tuple_id
                or not key.endswith(f"/{sha}.json")):
            raise UntrustedRecord(key, "wrong-key", f"a scan of {record.scan.tuple_id} with "
                                  f"sha256 {sha[:12]}, not the one its key names")
        records.append(record)
    return sorted(records, key=lambda r: r.recorded_at)
