"""k3a stage / k3a verify."""

from __future__ import annotations

from pathlib import Path

import click

from k3artifacts.cli import cli
from k3artifacts.cli.common import (
    ByteSize,
    emit,
    get_store,
    handle_errors,
    json_option,
    store_option,
)
from k3artifacts.config import default_workers
from k3artifacts.reporting.progress import StageProgress, make_progress
from k3artifacts.revisions.refs import check_repo_id
from k3artifacts.staging.download import RetryPolicy
from k3artifacts.staging.engine import StageOptions, StageResult, stage
from k3artifacts.staging.hub import HubSource
from k3artifacts.staging.quarantine import quarantine_root_for
from k3artifacts.stores.base import Store


def run_stage(
    store: Store,
    repo_id: str,
    revision: str,
    *,
    endpoint: str | None,
    quarantine: Path | None,
    options: StageOptions,
    as_json: bool,
    quiet: bool,
) -> StageResult:
    """The stage command's body; `k3a demo` runs exactly this against its local hub."""
    source = HubSource(endpoint=endpoint, retry=options.retry)
    with make_progress(enabled=not (as_json or quiet)) as progress:
        observer = StageProgress(progress, quiet=as_json or quiet)
        return stage(
            source,
            store,
            repo_id,
            revision,
            quarantine_root_for(store, quarantine),
            options,
            observer,
        )


def print_stage_result(result: StageResult) -> None:
    if result.already_published:
        click.echo(f"already published (no-op): {result.location}")
    else:
        rate = result.downloaded_bytes / result.seconds / 1e6 if result.seconds else 0.0
        click.echo(
            f"published {result.files} files, {result.total_bytes:,} bytes "
            f"({result.downloaded_bytes:,} downloaded, {result.reused_files} reused) "
            f"in {result.seconds:.1f}s ({rate:.0f} MB/s)"
        )
        click.echo(f"location:        {result.location}")
        stats = result.store_stats
        if stats.get("bytes_uploaded") or stats.get("bytes_copied"):
            click.echo(
                f"store:           {stats.get('bytes_uploaded', 0):,} bytes uploaded, "
                f"{stats.get('bytes_copied', 0):,} copied inside the store, "
                f"{stats.get('objects_skipped', 0)} object(s) already there"
            )
    click.echo(f"commit:          {result.commit}")
    click.echo(f"manifest digest: {result.manifest_digest}")
    click.echo(f"license sha256:  {result.license_sha256 or '(no license file)'}")
    if result.remote_code:
        click.echo(
            f"remote code:     {len(result.remote_code)} file(s) need review before promotion: "
            + ", ".join(result.remote_code)
        )


@cli.command("stage")
@click.argument("repo_id")
@click.option("--revision", default="main", show_default=True, help="Branch, tag or commit.")
@store_option
@click.option(
    "--quarantine",
    type=click.Path(path_type=Path, file_okay=False),
    envvar="K3A_QUARANTINE",
    help="Local download directory [default: beside a file store, else ~/.cache/k3artifacts].",
)
@click.option("--endpoint", envvar="HF_ENDPOINT",
              help="Hub URL [default: $HF_ENDPOINT or huggingface.co].")
@click.option("--workers", type=int, default=default_workers, show_default="cores, 2 to 8",
              help="Files downloaded at once.")
@click.option("--allow-pickle", is_flag=True,
              help="Accept .bin/.pt/.pkl weights (they can run code).")
@click.option("--keep-quarantine", is_flag=True, help="Keep the local copy after publishing.")
@click.option("--window-bytes", type=ByteSize(), default=None,
              help="Bound local quarantine disk (e.g. 500GiB): shards leave it once stored.")
@click.option("--retries", default=8, show_default=True,
              help="Attempts per file that make no progress before giving up.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@json_option
@handle_errors
def stage_cmd(repo_id, revision, store_url, quarantine, endpoint, workers, allow_pickle,
              keep_quarantine, window_bytes, retries, quiet, as_json):
    """Download, verify and publish REPO_ID at --revision into the store.

    The revision is resolved to a commit once; every file is hashed as it arrives (sha256
    against the hub's LFS sha256, xxh3-128 for later checks), safetensors headers and the
    shard index are checked, the license and any *.py remote code are captured, and the
    revision is published atomically with its manifest. An interrupted run re-run with the
    same arguments resumes partial files and skips verified ones.

    \b
    Example:
      k3a stage moonshotai/Kimi-K3 --revision main --store file:///fsx/k3a
    Exit codes: 0 published or already published, 3 refused (nothing published),
    6 another run holds this revision, 7 repo/revision not found, 8 hub unreachable.
    """
    check_repo_id(repo_id)
    store = get_store(store_url)
    options = StageOptions(
        allow_pickle=allow_pickle,
        workers=workers,
        keep_quarantine=keep_quarantine,
        window_bytes=window_bytes,
        retry=RetryPolicy(attempts=retries),
    )
    result = run_stage(
        store, repo_id, revision, endpoint=endpoint, quarantine=quarantine,
        options=options, as_json=as_json, quiet=quiet,
    )
    emit(as_json, result.__dict__, lambda: print_stage_result(result))
