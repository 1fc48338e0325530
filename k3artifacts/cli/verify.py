"""k3a verify: what a node runs before an endpoint starts. Imports nothing of the Hub client."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import (
    emit,
    from_settings,
    get_store,
    json_option,
    load,
    local_policies_option,
    progress_options,
    refuse_local_policies,
    reporter,
    store_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.errors import UsageError, VerifyMismatch

if TYPE_CHECKING:
    from k3artifacts.stores.verify import VerifyReport


def parse_target(target: str, *, tuples: bool = False) -> tuple[str, str] | Path | str:
    from k3artifacts.releases.tuples import TUPLE_ID
    from k3artifacts.revisions.refs import COMMIT, check_repo_id, match_revision_ref

    if tuples and TUPLE_ID.match(target):
        return target
    ref = match_revision_ref(target)
    if ref is not None:
        return ref
    repo_id, sep, commit = target.rpartition("@")
    if sep and COMMIT.match(commit):
        check_repo_id(repo_id)  # shaped like a revision: say what is wrong with its repo id
    path = Path(target)
    if path.is_dir():
        return path
    raise UsageError(
        f"{target!r} is neither org/name@<40-hex commit> nor a revision directory",
        hint="e.g. k3a verify moonshotai/Kimi-K3@<commit>, or a path ending in /<commit>",
    )


@exits(
    (0, "every file matches"),
    (2, "malformed TARGET or --expect-digest"),
    (4, "some file is missing, changed or unexpected (listed), the digest differs, the signature "
        "is missing, by an untrusted key or over other bytes, or the store's policy history does "
        "not verify"),
    (7, "not a published revision or no store there"),
    (9, "a local --policies, or no root pinned for the store"),
)
@click.command("verify")
@click.argument("target")
@store_option
@click.option("--full", is_flag=True, help="Check sha256 (slower) instead of xxh3-128.")
@click.option("--expect-digest", help="Refuse unless the manifest digest is exactly this.")
@click.option(
    "--signature",
    "check_signature",
    is_flag=True,
    help="First check the revision's signature (.k3a/model.sig) against the release keys the "
    "store's policy in force trusts (signed into force by its root, verified from the root "
    "this client pins), then the bytes against the signed manifest. TARGET may then be a "
    "tuple id: its own signature is checked too.",
)
@click.option("--channel", default=from_settings(lambda: load().channel),
              show_default="$K3A_CHANNEL or the context's channel, else none",
              help="With --signature: trust only the keys this channel's signing policy lists.")
@local_policies_option
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Files hashed at once  [default: one per usable core; at least 4 from a "
              "remote store]")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar or progress lines.")
@progress_options
@json_option
def verify_cmd(target, store_url, full, expect_digest, check_signature, channel, local_policies,
               workers, quiet, progress_interval, log_format, as_json):
    """Re-hash a published revision against its manifest; run on a node before serving.

    TARGET is org/name@<commit> (looked up in --store) or a revision directory such as
    /fsx/k3a/models/moonshotai/Kimi-K3/<commit>.
    """
    from k3artifacts.reporting.progress import BytesProgress
    from k3artifacts.revisions.refs import check_manifest_digest
    from k3artifacts.stores.verify import verify_revision

    if expect_digest is not None:
        check_manifest_digest(expect_digest)
    if local_policies is not None:
        refuse_local_policies(local_policies, get_store(store_url),
                              "trusted release keys come from")
    if check_signature:
        _verify_signed(target, store_url, full, expect_digest, channel, workers, quiet,
                       progress_interval, log_format, as_json)
        return
    parsed = parse_target(target)
    store = None if isinstance(parsed, Path) else get_store(store_url)
    with reporter("verifying", quiet=quiet, as_json=as_json, interval=progress_interval,
                  log_format=log_format) as progress:
        bar = BytesProgress(progress)
        kwargs = dict(full=full, expect_digest=expect_digest, workers=workers, on_bytes=bar,
                      on_manifest=lambda m: bar.set_total(m.total_bytes, len(m.files)),
                      on_file=bar.file_done)
        if isinstance(parsed, Path):
            report = verify_revision(directory=parsed, **kwargs)
        else:
            report = verify_revision(store=store, repo_id=parsed[0],
                                     commit=parsed[1], **kwargs)
    emit(as_json, _payload(report), lambda: report.ok and _say_ok(report))
    report.raise_for_problems()


def _payload(report: VerifyReport, **signed: str | None) -> dict:
    """What ``--json`` prints of a report; ``signed``: who signed what, with --signature."""
    return {"target": report.target, "ok": report.ok, "algorithm": report.algorithm,
            "manifest_digest": report.manifest_digest, **signed, "files": report.files,
            "bytes": report.bytes, "problems": [p.__dict__ for p in report.problems]}


def _say_ok(report: VerifyReport) -> None:
    click.echo(f"ok: {report.files} files, {report.bytes:,} bytes match ({report.algorithm})")
    click.echo(f"manifest digest: {report.manifest_digest}")


def _verify_signed(target, store_url, full, expect_digest, channel, workers, quiet,
                   progress_interval, log_format, as_json):
    # Imported here: a plain `k3a verify` on a node needs neither cryptography nor policies.
    from k3artifacts.policy.signing_keys import trusted_keys
    from k3artifacts.releases.signatures import check_tuple_signature
    from k3artifacts.releases.tuples import TupleStore
    from k3artifacts.reporting.progress import BytesProgress
    from k3artifacts.signing.verify import verify_signed_revision

    store = get_store(store_url)
    trusted = trusted_keys(store).for_channel(channel)
    parsed = parse_target(target, tuples=True)
    tuple_signer = None
    if isinstance(parsed, str):
        tuple_signer = check_tuple_signature(store, parsed, trusted)
        weights = TupleStore(store).get(parsed).binding.weights
        if expect_digest is None:
            expect_digest = weights.manifest_digest
        parsed = (weights.repo_id, weights.commit)
    with reporter("verifying", quiet=quiet, as_json=as_json, interval=progress_interval,
                  log_format=log_format) as progress:
        bar = BytesProgress(progress)
        kwargs = dict(full=full, workers=workers, on_bytes=bar,
                      on_manifest=lambda m: bar.set_total(m.total_bytes, len(m.files)),
                      on_file=bar.file_done)
        if isinstance(parsed, Path):
            checked = verify_signed_revision(trusted, directory=parsed, **kwargs)
        else:
            checked = verify_signed_revision(trusted, store=store,
                                             repo_id=parsed[0], commit=parsed[1], **kwargs)
    report = checked.report
    if expect_digest is not None and report.manifest_digest != expect_digest:
        raise VerifyMismatch(f"{report.target}: the signed manifest has digest "
                             f"{report.manifest_digest}, expected {expect_digest}")
    payload = _payload(report, signed_by=checked.key_name, key_hint=checked.key_hint,
                       tuple_signed_by=tuple_signer)

    def human() -> None:
        if report.ok:
            if tuple_signer is not None:
                click.echo(f"tuple {target}: signed by {tuple_signer}")
            click.echo(f"signature: ok, signed by {checked.key_name}")
            _say_ok(report)

    emit(as_json, payload, human)
    checked.raise_for_problems()
