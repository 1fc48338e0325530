"""``image_scan``: the artifact gate's scan half. The newest scan recorded for the tuple
(``k3a scan attach`` / ``k3a scan ecr``) is of the tuple's image digest and has no critical
finding; a critical finding can be accepted only by overriding this gate with a reason. Scans
are read only through their signatures (role ``scan``): one that does not verify is refused by
name (UntrustedRecord, exit 4), never counted."""

from __future__ import annotations

from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext, summarize
from k3artifacts.releases.scans import SCANS, list_scans

NAME = "image_scan"


def check(ctx: GateContext) -> GateResult:
    records = ctx.signed_here(list_scans(ctx.store, ctx.release.id, trust=ctx.trust), SCANS)
    image = ctx.release.binding.image
    if not records:
        return GateResult(name=NAME, passed=False, reason=(
            f"no scan of {image.reference} recorded (k3a scan attach {ctx.release.id} "
            "--report trivy.json, or k3a scan ecr)"))
    scan = records[-1].scan
    if scan.image_digest != image.digest:
        return GateResult(name=NAME, passed=False,
                          reason=f"the newest scan is of {scan.image_digest}, not {image.digest}")
    counts = ", ".join(f"{n} {s.lower()}" for s, n in scan.counts.items() if n) or "no findings"
    if scan.critical:
        return GateResult(name=NAME, passed=False, reason=(
            f"{scan.scanner} found {len(scan.critical)} critical: {summarize(scan.critical)} "
            f"({counts})"))
    return GateResult(name=NAME, passed=True, reason=f"{scan.scanner}: no critical ({counts})")
