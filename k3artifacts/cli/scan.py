"""``k3a scan attach | ecr``: record the serving image's vulnerability scan with the tuple
(the moves: ``releases/scanning.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import (
    acting_here,
    emit,
    get_store,
    json_option,
    store_option,
    typed_actor_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.cli.params import TUPLE_OR_CHANNEL

if TYPE_CHECKING:
    from k3artifacts.releases.scanning import Scanned

@click.group("scan")
def scan_group() -> None:
    """The serving image's vulnerability scan, recorded with the tuple (the image_scan gate:
    critical findings fail it unless overridden with a reason)."""


def _show(done: Scanned, as_json: bool) -> None:
    scan, record = done.scan, done.record

    def human() -> None:
        counts = ", ".join(f"{n} {s.lower()}" for s, n in scan.counts.items() if n)
        click.echo(f"{scan.scanner} scan of {scan.image_digest}: {counts or 'no findings'}")
        if scan.critical:
            click.echo("critical: " + ", ".join(scan.critical))
        click.echo(f"{'recorded' if done.written else 'already recorded'}: scan "
                   f"{record.scan_sha256[:12]} for {scan.tuple_id}")

    emit(as_json, {"written": done.written, "scan_sha256": record.scan_sha256,
                   "scan": scan.model_dump(mode="json")}, human)


@exits(
    (0, "recorded"),
    (7, "tuple not found"),
    (9, "not a Trivy/Grype report, a report of another image, or your key is no identity of the "
        "store's policy or lacks the role scan"),
)
@scan_group.command("attach")
@click.argument("tuple_or_channel", type=TUPLE_OR_CHANNEL)
@click.option("--report", "report_path", required=True,
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Trivy (`trivy image --format json`) or Grype (`grype -o json`) report of "
              "the tuple's image, scanned by digest.")
@typed_actor_option
@store_option
@json_option
def attach_cmd(tuple_or_channel: str, report_path: Path, by: str | None,
               store_url: str, as_json: bool) -> None:
    """Record a Trivy or Grype JSON report of the tuple's serving image.

    The record is signed by your key (role scan).
    """
    from k3artifacts.releases.scanning import scan_attach
    store = get_store(store_url)
    _show(scan_attach(store, tuple_or_channel, report_path.read_bytes(), str(report_path),
                      by=acting_here(store, by)), as_json)


@exits(
    (0, "recorded"),
    (7, "tuple not found"),
    (8, "ECR unavailable"),
    (9, "scan not complete, or your key is no identity of the store's policy or lacks the role "
        "scan"),
)
@scan_group.command("ecr")
@click.argument("tuple_or_channel", type=TUPLE_OR_CHANNEL)
@click.option("--repository", default=None,
              help="ECR repository name (default: the tuple image's path after the registry).")
@click.option("--region", default=None, help="The registry's region (default: from the host).")
@typed_actor_option
@store_option
@json_option
def ecr_cmd(tuple_or_channel: str, repository: str | None, region: str | None, by: str | None,
            store_url: str, as_json: bool) -> None:
    """Record ECR's scan findings (basic or enhanced) for the tuple's image digest.

    The record is signed by your key (role scan).
    """
    from k3artifacts.releases.scanning import scan_ecr
    store = get_store(store_url)
    _show(scan_ecr(store, tuple_or_channel, repository=repository, region=region,
                   by=acting_here(store, by)), as_json)
