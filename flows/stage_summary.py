"""The record a staging run leaves: the summary artifact and the run's closing log line.

The summary's key (``k3a-<repo>-<commit12>-summary``) names the revision, so the artifacts
page shows the latest *real* summary of each revision. A re-run that finds the revision
already published does not write a version of that key (it would hide the run that did the
work behind a "nothing to do"); it leaves an unkeyed note on its own run pointing at it.
"""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

from .artifacts import duration, fields_table, human_bytes, sha256, size


def throughput(summary: dict) -> str:
    seconds = max(summary["seconds"], 1e-6)
    return f"{human_bytes(summary['downloaded_bytes'] / seconds)}/s"


def next_command(summary: dict) -> str:
    if summary["tuple_id"]:
        return f"k3a promote {summary['tuple_id']} staging"
    return (f"k3a tuple create {summary['repo_id']}@{summary['commit']} "
            "--image REPO:TAG --profile PROFILE")


def closing_line(summary: dict) -> str:
    """One log line with what a reader of the run log came for."""
    if summary["already_published"]:
        return (f"{summary['repo_id']}@{summary['commit']} was already published: manifest "
                f"{sha256(summary['manifest_digest'])} at {summary['location']}; nothing done")
    return (f"published {summary['repo_id']}@{summary['commit']}: manifest "
            f"{sha256(summary['manifest_digest'])} at {summary['location']}, "
            f"{summary['files']} files, {human_bytes(summary['total_bytes'])} in "
            f"{duration(summary['seconds'])} ({throughput(summary)} downloaded); "
            f"next: {next_command(summary)}")


def summary_artifact(summary: dict, *, key: str) -> None:
    if summary["already_published"]:
        _noop_note(summary, key)
        return
    code = ", ".join(f"`{p}`" for p in summary["remote_code"]) or "none"
    tuple_id = f"`{summary['tuple_id']}`" if summary["tuple_id"] else "not made"
    body = fields_table([
        ("state", "published"),
        ("location", f"`{summary['location']}`"),
        ("manifest digest", f"`{sha256(summary['manifest_digest'])}`"),
        ("license sha256", f"`{sha256(summary['license_sha256'])}`"
         if summary["license_sha256"] else "no license file"),
        ("remote code (review before promotion)", code),
        ("files", f"{summary['files']}, {size(summary['total_bytes'])}"),
        ("downloaded", f"{size(summary['downloaded_bytes'])} pulled from the Hub; "
                       f"{summary['reused_files']} file(s) verified by an earlier run"),
        ("reused", f"{size(summary['reused_bytes'])} copied inside the store from published "
                   "revisions"),
        ("uploaded", size(sum(summary["store_stats"].get(k, 0)
                              for k in ("bytes_uploaded", "bytes_stored")))),
        *(("not reused (downloaded instead)", reason) for reason in summary["reuse_fallbacks"]),
        ("duration", duration(summary["seconds"])),
        ("throughput", throughput(summary)),
        ("release tuple", tuple_id),
        ("next", f"`{next_command(summary)}`"),
    ])
    create_markdown_artifact(
        f"# {summary['repo_id']} @ `{summary['commit']}`\n\n{body}", key=key,
        description=f"staged {summary['repo_id']}@{summary['commit'][:12]}: what to review, "
                    "where it lives, what to run next",
    )


def _noop_note(summary: dict, key: str) -> None:
    with get_client(sync_client=True) as client:
        latest = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            sort=ArtifactSort.CREATED_DESC, limit=1,
        )
        run = client.read_flow_run(latest[0].flow_run_id) if latest and latest[0].flow_run_id \
            else None
    where = (f"the summary of run **{run.name}** (`{run.id}`), artifact key `{key}`" if run
             else f"artifact key `{key}` (written by the run that published it)")
    create_markdown_artifact(
        f"# {summary['repo_id']} @ `{summary['commit']}`: already published\n\n"
        f"Nothing was downloaded or written. See {where}.\n\n"
        + fields_table([
            ("location", f"`{summary['location']}`"),
            ("manifest digest", f"`{sha256(summary['manifest_digest'])}`"),
            ("release tuple", f"`{summary['tuple_id']}`" if summary["tuple_id"] else "not made"),
        ]),
        description="no-op re-run: the revision was already published",
    )
