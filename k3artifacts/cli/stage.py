"""k3a stage / k3a verify."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import (
    ByteSize,
    default_workers,
    emit,
    get_store,
    json_option,
    progress_options,
    reporter,
    resumable,
    signing_key_option,
    store_option,
)

if TYPE_CHECKING:
    from k3artifacts.staging.engine import StageOptions, StageResult
    from k3artifacts.staging.plan import StagePlan
    from k3artifacts.stores.base import Store

from k3artifacts.cli.exits import exits
from k3artifacts.cli.params import REPO_ID
from k3artifacts.reporting.progress import DEFAULT_INTERVAL


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
    progress_interval: float = DEFAULT_INTERVAL,
    log_format: str = "text",
) -> StageResult:
    """The stage command's body; `k3a demo` runs exactly this against its local hub."""
    from k3artifacts.reporting.progress import StageProgress
    from k3artifacts.staging.engine import stage
    from k3artifacts.staging.hub import HubSource
    from k3artifacts.staging.quarantine import quarantine_root_for

    source = HubSource(endpoint=endpoint, retry=options.retry)
    with reporter("staging", quiet=quiet, as_json=as_json, interval=progress_interval,
                  log_format=log_format) as progress:
        observer = StageProgress(progress)
        store.watch_transfers(observer.store_progress)
        return stage(
            source,
            store,
            repo_id,
            revision,
            quarantine_root_for(store, quarantine),
            options,
            observer,
        )


def print_stage_result(result: StageResult, unreviewed: list[str]) -> None:
    """The summary of a stage; ``unreviewed``: its remote-code files no review covers yet."""
    if result.already_published:
        click.echo(f"already published (no-op): {result.location}")
    else:
        click.echo(
            f"published {result.files} files, {result.total_bytes:,} bytes "
            f"({result.downloaded_bytes:,} downloaded, {result.reused_files} reused) "
            f"in {result.seconds:.1f}s ({_download_rate(result)})"
        )
        click.echo(f"location:        {result.location}")
        stats = result.store_stats
        click.echo(
            f"bytes:           {result.downloaded_bytes:,} pulled from the Hub, "
            f"{result.reused_bytes:,} reused from published revisions"
        )
        # What the store did with each file, in files and in bytes: an object store uploads,
        # copies inside itself or references bytes a published revision keeps; a file store
        # places the quarantine's file in its tree (a hard link on one file system, else a copy).
        done = [
            f"{stats[f'objects_{name}']} {label} ({stats[f'bytes_{name}']:,} bytes)"
            for name, label in (("uploaded", "uploaded"), ("copied", "copied inside the store"),
                                ("referenced", "shared with published revisions, nothing moved"),
                                ("stored", "placed in the store's tree (hard link, else copy)"))
            if stats.get(f"objects_{name}")
        ]
        if stats.get("objects_skipped"):
            done.append(f"{stats['objects_skipped']} already there")
        if done:
            click.echo(f"store files:     {', '.join(done)}")
        for reason in result.reuse_fallbacks:
            click.echo(f"not reused:      {reason} (downloaded instead)")
    click.echo(f"commit:          {result.commit}")
    click.echo(f"manifest digest: {result.manifest_digest}")
    click.echo(f"license sha256:  {result.license_sha256 or '(no license file)'}")
    if result.signature:
        click.echo(f"signature:       {result.signature}")
    if result.remote_code:
        reviewed = [path for path in result.remote_code if path not in unreviewed]
        said = []
        if unreviewed:
            said.append(f"{len(unreviewed)} file(s) need review before promotion: "
                        + ", ".join(unreviewed))
        if reviewed:
            said.append(f"{len(reviewed)} file(s) already reviewed (same sha256): "
                        + ", ".join(reviewed))
        click.echo("remote code:     " + "; ".join(said))


def _download_rate(result: StageResult) -> str:
    """What the Hub's bytes came at, in a unit that says it (a small incremental stage moves
    kilobytes: "0 MB/s" would read as a stall)."""
    from k3artifacts.reporting.progress import human_size

    if not result.downloaded_bytes:
        return "nothing downloaded"
    if result.seconds <= 0:
        return "downloaded at once"
    return f"{human_size(result.downloaded_bytes / result.seconds)}/s averaged over the run"


def unreviewed_staged_code(store: Store, result: StageResult) -> list[str]:
    """The remote-code files of the revision a stage published that no trusted review covers
    yet (:func:`k3artifacts.releases.reviewing.unreviewed_code`); nothing read from the store
    when it staged no remote code."""
    from k3artifacts.releases.reviewing import unreviewed_code

    return unreviewed_code(store, result.repo_id, result.commit) if result.remote_code else []


def print_plan(plan: StagePlan) -> None:
    click.echo(f"plan for {plan.repo_id}@{plan.commit}"
               + (" (already published: nothing to do)" if plan.already_published else ""))
    width = max((len(f.path) for f in plan.files), default=4)
    for f in plan.files:
        origin = f"  from {f.source_commit}:{f.source_path}" if f.source_commit else ""
        click.echo(f"  {f.action:<8}  {f.path:<{width}}  {f.size:>15,}{origin}")
    for action, total in plan.totals().items():
        click.echo(f"{action + ':':<10} {total.files:>6} file(s) {total.bytes:>18,} bytes")


@exits(
    (0, "published or already published (repaired, or nothing to repair)"),
    (2, "malformed repo id"),
    (3, "refused (nothing published)"),
    (4, "--repair could not make the revision match its manifest"),
    (6, "another run holds this revision"),
    (7, "repo/revision not found (or not published, for --repair)"),
    (8, "hub or store unreachable (within seconds if it never answered), silent past "
        "--read-timeout, answering past K3A_HTTP_DEADLINE, or slower than --min-rate"),
    (9, "a store URL or path that cannot be used or made"),
    (10, "the hub refused HF_TOKEN (401), or a gated repo's terms are not accepted (403)"),
    (130, "Ctrl-C"),
)
@click.command("stage")
@click.argument("repo_id", type=REPO_ID)
@click.option("--revision", default="main", show_default=True, help="Branch, tag or commit.")
@store_option
@click.option(
    "--quarantine",
    type=click.Path(path_type=Path, file_okay=False),
    help="Local download directory [default: $K3A_QUARANTINE, else beside a file store, else "
    "~/.cache/k3artifacts].",
)
@click.option("--endpoint", envvar="HF_ENDPOINT",
              help="Hub URL [default: $HF_ENDPOINT or huggingface.co].")
@click.option("--workers", type=int, default=default_workers, show_default="cores, 2 to 8",
              help="Files downloaded at once.")
@click.option("--streams", type=click.IntRange(min=1), default=None,
              show_default="4, for files over one 32 MiB range",
              help="Connections per large file: it is fetched as ranges this many at a time "
              "from the Hub's CDN (one connection rarely fills a long-distance link). 1: one "
              "stream per file.")
@click.option("--allow-pickle", is_flag=True,
              help="Accept .bin/.pt/.pkl weights (they can run code).")
@click.option("--keep-quarantine", is_flag=True, help="Keep the local copy after publishing.")
@click.option("--window-bytes", type=ByteSize(), default=None,
              help="Bound local quarantine disk (e.g. 500GiB): shards leave it once stored.")
@click.option("--retries", type=click.IntRange(min=1), default=None,
              show_default="$K3A_HTTP_ATTEMPTS or 8",
              help="Attempts per file (per range, for a file fetched as ranges) that bring no "
              "new byte before giving up.")
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=None,
              show_default="$K3A_HTTP_CONNECT_TIMEOUT or 10",
              help="Seconds to connect to the hub or its CDN (and, for a host that never "
              "answered, to get its first headers).")
@click.option("--read-timeout", type=click.FloatRange(min=0.1), default=None,
              show_default="$K3A_HTTP_READ_TIMEOUT or 60",
              help="Seconds without a byte before a call or transfer is cut (a transfer is then "
              "resumed).")
@click.option("--min-rate", type=ByteSize(), default=None,
              show_default="$K3A_HTTP_MIN_RATE or 64KiB",
              help="Per-file rate floor in bytes/s over --rate-window, counted across "
              "reconnects: a slower transfer is cut and resumed; 3 slow windows in a row fail "
              "the run (exit 8).")
@click.option("--rate-window", type=click.FloatRange(min=0.1), default=None,
              show_default="$K3A_HTTP_RATE_WINDOW or 60",
              help="Seconds over which --min-rate is measured.")
@signing_key_option
@click.option("--reverify-reused", is_flag=True,
              help="Re-hash (xxh3-128) each file reused from a published revision after the "
              "store copied it, where the store keeps no checksum (a file tree; S3 always "
              "checks its CRC64NVME).")
@click.option("--plan", "--dry-run", "plan_only", is_flag=True,
              help="Print what would be downloaded, reused (from which revision) or is already "
              "there, per file and in total, and change nothing.")
@click.option("--repair", is_flag=True,
              help="For a published revision: re-hash every file (sha256), fetch each one that "
              "fails from the Hub at the same commit, check it against the manifest and put "
              "it back. The manifest is not rewritten: the revision keeps its digest.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or progress lines.")
@progress_options
@json_option
@resumable
def stage_cmd(repo_id, revision, store_url, quarantine, endpoint, workers, streams, allow_pickle,
              keep_quarantine, window_bytes, retries, connect_timeout, read_timeout, min_rate,
              rate_window, signing_key, reverify_reused, plan_only, repair, quiet,
              progress_interval, log_format, as_json):
    """Download, verify and publish REPO_ID at --revision into the store.

    The revision is resolved to a commit once; every file is hashed as it arrives (sha256
    against the hub's LFS sha256, xxh3-128 for later checks), safetensors headers and the
    shard index are checked, the license and any *.py remote code are captured, and the
    revision is published atomically with its manifest. An interrupted run re-run with the
    same arguments resumes partial files and skips verified ones (Ctrl-C exits 130).

    Progress: a bar on a terminal; otherwise (a Job, CI, a Prefect worker) one line every
    --progress-interval seconds with bytes done/total, rate, ETA and files done/total, as
    JSON objects with --log-format json.

    With --signing-key (or K3A_SIGNING_KEY) the published revision is signed (.k3a/model.sig)
    from the digests just computed: no byte is read again.

    Before any byte moves, each file is planned: already verified here, reused from a
    published revision of the repo holding the same content (same upstream hash and size;
    copied inside the store, never through this machine), or downloaded. --plan prints that
    plan and stops. A reused file whose copy fails its check is downloaded instead.

    \b
    Example:
      k3a stage moonshotai/Kimi-K3 --revision main --store file:///fsx/k3a

    --repair is for a published revision that `k3a verify` finds damaged: only the files
    that fail are fetched again and put back, then the revision is verified in full.
    """
    from k3artifacts.net.policy import RetryPolicy
    from k3artifacts.revisions.refs import check_repo_id
    from k3artifacts.staging.download import Ranges
    from k3artifacts.staging.engine import StageOptions, plan_stage
    from k3artifacts.staging.hub import HubSource
    from k3artifacts.staging.quarantine import quarantine_root_for
    from k3artifacts.staging.repair import repair_revision

    check_repo_id(repo_id)
    store = get_store(store_url, must_exist=False)
    options = StageOptions(
        allow_pickle=allow_pickle,
        workers=workers,
        ranges=Ranges() if streams is None else Ranges(streams=streams),
        keep_quarantine=keep_quarantine,
        window_bytes=window_bytes,
        # What is not given on the command line comes from the settings (K3A_HTTP_*).
        retry=RetryPolicy(**{name: value for name, value in (
            ("attempts", retries), ("connect_timeout", connect_timeout),
            ("read_timeout", read_timeout), ("min_rate", min_rate),
            ("rate_window", rate_window)) if value is not None}),
        signing_key=signing_key,
        reverify_reused=reverify_reused,
    )
    if repair and plan_only:
        raise click.UsageError("--repair puts files back; --plan (--dry-run) changes nothing: "
                               "choose one")
    if repair:
        source = HubSource(endpoint=endpoint, retry=options.retry)
        commit = source.resolve(repo_id, revision)
        result = repair_revision(
            source, store, repo_id, commit,
            quarantine_root_for(store, quarantine) / "repair" / commit, workers=workers,
            on_file=None if as_json or quiet else
            lambda path, why: click.echo(f"repaired {path} (was: {why})", err=True))
        emit(as_json, result.__dict__, lambda: click.echo(
            f"{repo_id}@{commit}: {len(result.repaired)} of {result.files} file(s) put back, "
            f"{result.downloaded_bytes:,} bytes fetched; verified in full; manifest digest "
            f"{result.manifest_digest} (unchanged)"))
        return
    if plan_only:
        plan = plan_stage(HubSource(endpoint=endpoint, retry=options.retry), store, repo_id,
                          revision, quarantine_root_for(store, quarantine), options)
        emit(as_json, plan.model_dump(mode="json") | {"totals": plan.summary()},
             lambda: print_plan(plan))
        return
    result = run_stage(
        store, repo_id, revision, endpoint=endpoint, quarantine=quarantine,
        options=options, as_json=as_json, quiet=quiet, progress_interval=progress_interval,
        log_format=log_format,
    )
    emit(as_json, result.__dict__,
         lambda: print_stage_result(result, unreviewed_staged_code(store, result)))
