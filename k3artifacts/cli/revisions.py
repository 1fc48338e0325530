"""``k3a revision list|gc``: what the store holds for a model, and retiring what no channel
can reach."""

from __future__ import annotations

import click

from k3artifacts.cli.common import emit, get_store, json_option, store_option
from k3artifacts.cli.exits import exits
from k3artifacts.cli.gc import gc_cmd
from k3artifacts.cli.params import REPO_ID


@click.group("revision")
def revision_group() -> None:
    """Published revisions in the store. `k3a revisions REPO_ID` and `k3a gc` are the old
    spellings of `list` and `gc`."""


@exits((0, "listed (an empty list is not an error)"), (2, "a malformed repo id"),
       (7, "no store there"), 8)
@revision_group.command("list")
@click.argument("repo_id", type=REPO_ID)
@store_option
@json_option
def revision_list(repo_id, store_url, as_json):
    """List the published revisions of REPO_ID in the store (commit, size, manifest digest).

    A revision appears here only once its manifest is written, so a staging in progress or
    an interrupted one is never listed.
    """
    from k3artifacts.revisions.refs import check_repo_id

    store = get_store(store_url)
    rows = []
    for commit in store.list_revisions(check_repo_id(repo_id)):
        manifest = store.read_manifest(repo_id, commit)
        if manifest is None:  # deleted between the listing and the read
            continue
        rows.append({
            "commit": commit,
            "files": len(manifest.files),
            "total_bytes": manifest.total_bytes,
            "manifest_digest": manifest.digest(),
            "license_sha256": manifest.license.sha256,
            "location": store.location(repo_id, commit),
        })

    def human() -> None:
        if not rows:
            click.echo(f"no published revisions of {repo_id} in {store.url}")
        for row in rows:
            click.echo(f"{row['commit']}  {row['files']:>5} files  {row['total_bytes']:>16,} bytes"
                       f"  manifest {row['manifest_digest'][:16]}")

    emit(as_json, rows, human)


revision_group.add_command(gc_cmd)
