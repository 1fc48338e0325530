"""k3a verify: what a node runs before an endpoint starts. Imports nothing of the Hub client."""

from __future__ import annotations

from pathlib import Path

import click

from k3artifacts.cli import cli
from k3artifacts.cli.common import emit, get_store, handle_errors, json_option, store_option
from k3artifacts.errors import ConfigError
from k3artifacts.reporting.progress import BytesProgress, make_progress
from k3artifacts.revisions.refs import COMMIT, check_repo_id, match_revision_ref
from k3artifacts.stores.verify import verify_revision


def parse_target(target: str) -> tuple[str, str] | Path:
    ref = match_revision_ref(target)
    if ref is not None:
        return ref
    repo_id, sep, commit = target.rpartition("@")
    if sep and COMMIT.match(commit):
        check_repo_id(repo_id)  # shaped like a revision: say what is wrong with its repo id
    path = Path(target)
    if path.is_dir():
        return path
    raise ConfigError(
        f"{target!r} is neither org/name@<40-hex commit> nor a revision directory",
        hint="e.g. k3a verify moonshotai/Kimi-K3@<commit>, or a path ending in /<commit>",
    )


@cli.command("verify")
@click.argument("target")
@store_option
@click.option("--full", is_flag=True, help="Check sha256 (slower) instead of xxh3-128.")
@click.option("--expect-digest", help="Refuse unless the manifest digest is exactly this.")
@click.option("--workers", default=4, show_default=True, help="Files hashed at once.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@json_option
@handle_errors
def verify_cmd(target, store_url, full, expect_digest, workers, quiet, as_json):
    """Re-hash a published revision against its manifest; run on a node before serving.

    TARGET is org/name@<commit> (looked up in --store) or a revision directory such as
    /fsx/k3a/models/moonshotai/Kimi-K3/<commit>.

    Exit codes: 0 every file matches, 4 some file is missing, changed or unexpected
    (listed), 7 not a published revision.
    """
    parsed = parse_target(target)
    with make_progress(enabled=not (as_json or quiet)) as progress:
        bar = BytesProgress(progress, "verifying")
        kwargs = dict(full=full, expect_digest=expect_digest, workers=workers, on_bytes=bar,
                      on_manifest=lambda m: bar.set_total(m.total_bytes))
        if isinstance(parsed, Path):
            report = verify_revision(directory=parsed, **kwargs)
        else:
            report = verify_revision(store=get_store(store_url), repo_id=parsed[0],
                                     commit=parsed[1], **kwargs)
    payload = {
        "target": report.target,
        "ok": report.ok,
        "algorithm": report.algorithm,
        "manifest_digest": report.manifest_digest,
        "files": report.files,
        "bytes": report.bytes,
        "problems": [p.__dict__ for p in report.problems],
    }

    def human() -> None:
        if report.ok:
            click.echo(
                f"ok: {report.files} files, {report.bytes:,} bytes match ({report.algorithm})"
            )
            click.echo(f"manifest digest: {report.manifest_digest}")

    emit(as_json, payload, human)
    report.raise_for_problems()
