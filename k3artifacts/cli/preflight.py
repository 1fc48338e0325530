"""``k3a preflight``: the infrastructure gate's evidence, read from AWS and the cluster
(the move: ``preflight/run.py``)."""

from __future__ import annotations

from pathlib import Path

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
from k3artifacts.errors import GateFailed


@exits(
    (0, "every check passed (recorded)"),
    (5, "a check failed (recorded)"),
    (7, "tuple not found"),
    (9, "no infrastructure policy for the channel, or your key is no identity of the store's "
        "policy or lacks the role preflight"),
)
@click.command("preflight")
@click.argument("tuple_or_channel", type=TUPLE_OR_CHANNEL)
@click.option("--channel", required=True,
              help="The channel about to serve the tuple: its `infrastructure:` policy says "
              "where (region, subnets, role, window, load target).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              envvar="KUBECONFIG", default=None, show_envvar=True,
              help="The cluster's kubeconfig, for node health (current context; exec "
              "credential plugins such as `aws eks get-token` are run). Without one, in a pod: "
              "its service account.")
@click.option("--aws-profile", default=None, help="AWS profile to read the account with.")
@typed_actor_option
@store_option
@json_option
def preflight_cmd(tuple_or_channel: str, channel: str, kubeconfig: Path | None,
                  aws_profile: str | None, by: str | None, store_url: str,
                  as_json: bool) -> None:
    """Check the infrastructure a tuple is about to run on; record what was found.

    \b
    capacity            an active EC2 capacity reservation of the profile's instance type, in
                        the subnets' zone, lasting warm-up + soak + production, big enough
    storage_throughput  FSx for Lustre per-unit throughput x capacity reads the checkpoint
                        within max_load_seconds (S3: from the node cache)
    iam                 the inference role's policies, evaluated: reads this revision only
    private_networking  an available S3 gateway endpoint on the subnets' VPC
    node_health         Ready nodes of the instance type with allocatable nvidia.com/gpu

    The record is signed by your key (role preflight).
    """
    from k3artifacts.preflight.run import preflight
    store = get_store(store_url)
    done = preflight(store, tuple_or_channel, channel, kubeconfig=kubeconfig,
                     aws_profile=aws_profile, by=acting_here(store, by))
    report, record, written = done.report, done.record, done.written
    release_id = report.tuple_id

    def human() -> None:
        for c in report.checks:
            click.echo(f"  {'ok  ' if c.passed else 'FAIL'} {c.name}: {c.reason}")
        verb = "recorded" if written else "already recorded"
        click.echo(f"{verb}: preflight {record.report_sha256[:12]} of {release_id} for {channel}")
        click.echo("infrastructure ready" if report.passed else "INFRASTRUCTURE NOT READY")

    emit(as_json, {"passed": report.passed, "written": written,
                   "report_sha256": record.report_sha256,
                   "report": report.model_dump(mode="json")}, human)
    if not report.passed:
        # Raised, not exited: the group prints the document with the error merged in.
        failed = ", ".join(c.name for c in report.checks if not c.passed)
        raise GateFailed(f"infrastructure not ready for {release_id} on {channel}: {failed}",
                         hint="fix what each check names and run `k3a preflight` again "
                         "(the infrastructure gate reads the newest record)")
