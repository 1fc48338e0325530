"""``k3a bootstrap`` (bucket settings) and ``k3a fsx preload`` (FSx for Lustre import)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import (
    emit,
    from_settings,
    get_store,
    json_option,
    load,
    store_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.errors import ConfigError

if TYPE_CHECKING:
    from k3artifacts.stores.bootstrap import BootstrapReport

endpoint_option = click.option(
    "--endpoint-url", default=None,
    help="S3 endpoint (moto, MinIO, VPC endpoint). Default: $K3A_S3_ENDPOINT_URL, "
    "else boto3's own.",
)
profile_option = click.option("--profile", envvar="AWS_PROFILE", help="AWS profile to use.")


@exits(
    (0, "done (or dry run shown)"),
    (7, "bucket missing (see --create-bucket)"),
    (8, "S3 unreachable"),
    (9, "bad ARN/URL or missing permission"),
)
@click.command("bootstrap")
@click.argument("bucket_url", metavar="s3://BUCKET[/PREFIX]")
@click.option("--admin-role-arn", required=True,
              help="The only role allowed to delete under models/ and releases/ or change "
              "bucket guardrails. Run bootstrap as this role.")
@click.option("--inference-role-arn", required=True,
              help="Serving role: reads models/ and releases/.")
@click.option("--kms-key-arn", required=True,
              help="KMS key (in the bucket's region) for default SSE-KMS encryption.")
@click.option("--downloader-role-arn", help="Staging role; allowed to read models/ for dedup.")
@click.option("--promoter-role-arn", help="Promotion role; allowed to read models/, releases/.")
@click.option("--reader-role-arn", "extra_readers", multiple=True,
              help="Another principal ARN (wildcards allowed) that may read models/ and "
              "releases/, e.g. the FSx service-linked role. Repeatable.")
@click.option("--log-bucket", help="Bucket receiving server access logs (not managed when "
              "omitted). Its policy must allow logging.s3.amazonaws.com; the error says how.")
@click.option("--log-prefix", help="Key prefix of the access logs. Default: BUCKET/PREFIX/.")
@click.option("--noncurrent-days", type=click.IntRange(min=1), default=30, show_default=True,
              help="Days before noncurrent object versions expire (what `k3a revision gc` leaves).")
@click.option("--create-bucket", is_flag=True, help="Create the bucket when it does not exist.")
@click.option("--dry-run", is_flag=True, help="Show what differs; change nothing.")
@click.option("--iam-out", type=click.Path(file_okay=False, path_type=Path),
              help="Also write the rendered IAM policies of the downloader, promoter and "
              "inference roles into this directory, for your IAM admin to attach.")
@endpoint_option
@profile_option
@json_option
def bootstrap_cmd(
    bucket_url: str, admin_role_arn: str, inference_role_arn: str, kms_key_arn: str,
    downloader_role_arn: str | None, promoter_role_arn: str | None,
    extra_readers: tuple[str, ...], log_bucket: str | None, log_prefix: str | None,
    noncurrent_days: int, create_bucket: bool, dry_run: bool, iam_out: Path | None,
    endpoint_url: str | None, profile: str | None, as_json: bool,
) -> None:
    """Apply the release bucket's settings from policies/s3, idempotently.

    Versioning (Enabled, never Suspended), default SSE-KMS encryption, the public access
    block, BucketOwnerEnforced ownership, a lifecycle rule aborting incomplete multipart
    uploads and expiring noncurrent versions (--noncurrent-days), access logging (with
    --log-bucket) and the bucket policy. Each live setting is
    compared with the wanted one; a differing one is shown as a diff and then written. A second
    run prints "no changes".
    """
    from k3artifacts.stores.bootstrap import bootstrap, bucket_and_prefix
    from k3artifacts.stores.bucket_policies import BucketPolicyInputs, iam_policies

    bucket, prefix = bucket_and_prefix(bucket_url)
    inputs = BucketPolicyInputs(
        bucket=bucket, prefix=prefix, admin_role_arn=admin_role_arn,
        inference_role_arn=inference_role_arn, kms_key_arn=kms_key_arn,
        downloader_role_arn=downloader_role_arn, promoter_role_arn=promoter_role_arn,
        extra_reader_arns=extra_readers, log_bucket=log_bucket, log_prefix=log_prefix,
        noncurrent_days=noncurrent_days,
    )
    from k3artifacts.stores import awsclients

    client = awsclients.s3_client(endpoint_url, profile, inputs.region)
    report = bootstrap(client, inputs, dry_run=dry_run, create_bucket=create_bucket)
    written: list[str] = []
    if iam_out is not None:
        iam_out.mkdir(parents=True, exist_ok=True)
        for role, document in iam_policies(inputs).items():
            path = iam_out / f"{role}.json"
            path.write_text(json.dumps(document, indent=2) + "\n")
            written.append(str(path))
    payload = {**report.as_dict(), "iam_policies_written": written}
    emit(as_json, payload, lambda: _print_report(report, written))


def _print_report(report: BootstrapReport, written: list[str]) -> None:
    if report.created_bucket:
        click.echo(f"{'would create' if report.dry_run else 'created'} s3://{report.bucket}")
    for change in report.changes:
        click.echo(change.diff() or f"{change.setting}: differs")
    if not report.changes:
        click.echo(f"s3://{report.bucket}: no changes")
    elif report.dry_run:
        click.echo(f"dry run: {len(report.changes)} setting(s) differ; nothing changed")
    else:
        click.echo(f"applied {len(report.changes)} setting(s): "
                   + ", ".join(c.setting for c in report.changes))
    for setting, why in report.unmanaged.items():
        click.echo(f"{setting}: {why}")
    for path in written:
        click.echo(f"wrote {path}")


@click.group("fsx")
def fsx_group() -> None:
    """FSx for Lustre file systems linked to the release bucket."""


@exits(
    (0, "task started"),
    (7, "revision or file system not found"),
    (8, "FSx unreachable"),
    (9, "store is not S3, file system not Lustre or not linked to the store's bucket"),
)
@fsx_group.command("preload")
@click.argument("ref", metavar="ORG/NAME@COMMIT")
@click.option("--file-system-id", required=True, help="FSx for Lustre file system (fs-...).")
@store_option
@click.option("--fsx-endpoint-url", default=None,
              help="FSx API endpoint. Default: boto3's own (AWS_ENDPOINT_URL_FSX honoured).")
@profile_option
@click.option("--region", default=from_settings(lambda: load().aws_region),
              help="Region of the file system.  [env var: AWS_REGION]")
@json_option
def fsx_preload(ref: str, file_system_id: str, store_url: str, fsx_endpoint_url: str | None,
                profile: str | None, region: str | None, as_json: bool) -> None:
    """Import a published revision's metadata from S3 into a linked FSx for Lustre file system.

    Starts an IMPORT_METADATA_FROM_REPOSITORY data repository task for the revision's S3
    prefix, so its files appear on the file system now rather than whenever automatic import
    gets to them. File contents still load on first read: hydrate them from a node that mounts
    the file system (docs/guides/s3-and-fsx.md, "FSx for Lustre"), then run `k3a verify` on the
    mounted path as the readiness check.
    """
    from k3artifacts.revisions.refs import match_revision_ref
    from k3artifacts.stores.fsx import start_preload

    parsed = match_revision_ref(ref)
    if parsed is None:
        raise click.BadParameter("write ORG/NAME@<40-hex commit>", param_hint="REF")
    repo_id, commit = parsed
    store = get_store(store_url)
    if store.placement(repo_id, commit).bucket is None:
        raise ConfigError(
            f"the store {store.url} is not S3; FSx imports from the S3 bucket it is linked to",
            hint="pass --store s3://bucket/prefix (the linked bucket)",
        )
    store.published_manifest_bytes(repo_id, commit, hint="stage it first (k3a stage)")
    store.materialize(repo_id, commit)  # the file system imports the prefix as it is
    from k3artifacts.stores import awsclients

    client = awsclients.client("fsx", endpoint_url=fsx_endpoint_url, profile=profile,
                               region=region)
    started = start_preload(client, file_system_id, store.location(repo_id, commit))
    emit(as_json, started.as_dict(), lambda: click.echo(
        f"started {started.task_type} task {started.task_id} ({started.lifecycle}) on "
        f"{file_system_id} for {', '.join(started.paths)}\n"
        f"watch it: aws fsx describe-data-repository-tasks --task-ids {started.task_id}"
    ))
