"""``k3a promote | rollback | history | channels | gates | review | eval``: moving channels."""

from __future__ import annotations

from pathlib import Path

import click

from k3artifacts.cli import cli
from k3artifacts.cli.common import emit, get_store, handle_errors, json_option, store_option
from k3artifacts.config import default_policies_dir
from k3artifacts.errors import GateFailed, K3AError
from k3artifacts.promotion.gates import check_gates
from k3artifacts.promotion.moves import MoveResult, promote, rollback
from k3artifacts.releases.actor import current_actor
from k3artifacts.releases.channels import GateResult, HistoryEntry, history, list_channels
from k3artifacts.releases.evaluations import attach_evaluation, list_evaluations, parse_report
from k3artifacts.releases.policies import load_gate_policy
from k3artifacts.releases.reviews import license_text, review_code, review_license

policies_option = click.option(
    "--policies",
    "policies_dir",
    envvar="K3A_POLICIES",
    default=lambda: str(default_policies_dir()),
    show_default="$K3A_POLICIES or ./policies",
    type=click.Path(file_okay=False, path_type=Path),
    help="Policy directory (promotion-gates.yaml, licenses/, code-reviews/) of the checkout.",
)


actor_option = click.option(
    "--by",
    "actor",
    default=current_actor,
    show_default="$K3A_ACTOR or your login name",
    help="Who is making this move (recorded in the history).",
)


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _verdict(r: GateResult) -> str:
    if r.passed:
        return "pass"
    return "FAIL (overridden)" if r.overridden else "FAIL"


def _gate_table(results: list[GateResult]) -> None:
    if results:
        _table([[r.name, _verdict(r), r.reason] for r in results], ["gate", "result", "reason"])
    else:
        click.echo("(no gates apply)")


def _move_summary(result: MoveResult) -> None:
    e = result.entry
    if not result.changed:
        click.echo(
            f"{result.channel} already points at {result.tuple_id} "
            f"({e.action} #{e.seq} by {e.who}); nothing written"
        )
        return
    for name in result.unused_overrides:
        click.echo(f"note: override of {name} not used (the gate passed); not recorded")
    click.echo(
        f"{result.channel}: {result.previous_tuple_id or '(empty)'} -> {result.tuple_id} "
        f"({e.action} #{e.seq} by {e.who})"
    )


@cli.command("promote")
@click.argument("tuple_id")
@click.argument("channel")
@click.option(
    "--override-gate",
    "override_gates",
    multiple=True,
    metavar="NAME",
    help="Let a failed gate pass; needs a --reason right after it. Repeatable.",
)
@click.option(
    "--reason",
    "override_reasons",
    multiple=True,
    help="Why the preceding --override-gate is acceptable (recorded in the history).",
)
@click.option("--why", default=None, help="Why this promotion (recorded in the history).")
@actor_option
@policies_option
@store_option
@json_option
@handle_errors
def promote_cmd(
    tuple_id: str,
    channel: str,
    override_gates: tuple[str, ...],
    override_reasons: tuple[str, ...],
    why: str | None,
    actor: str,
    policies_dir: Path,
    store_url: str,
    as_json: bool,
) -> None:
    """Move CHANNEL to TUPLE_ID after the channel's gates pass.

    The gates come from POLICIES/promotion-gates.yaml; each failed gate is listed with its
    reason and the pointer does not move, unless that gate is overridden with
    `--override-gate NAME --reason "..."`. The move is a compare-and-swap: if another promotion
    or rollback moved the channel meanwhile, this one writes nothing and names the winner.
    Promoting the tuple the channel already points at succeeds and writes nothing.

    \b
    Example:
      k3a promote k3t-0123456789abcdef01234567 production --why "eval passed" \\
          --override-gate evaluation --reason "suite flaky, manual check by bob"

    Exit codes: 0 moved (or already there), 5 a gate failed, 6 lost a race (another move won;
    nothing written), 7 unknown tuple or channel not in the policy, 9 bad policy or override.
    """
    if len(override_gates) != len(override_reasons):
        raise click.UsageError("give exactly one --reason for each --override-gate")
    overrides = dict(zip(override_gates, override_reasons, strict=True))
    result = promote(
        get_store(store_url),
        tuple_id,
        channel,
        actor=actor,
        reason=why,
        overrides=overrides,
        policies_dir=policies_dir,
    )

    def human() -> None:
        _gate_table(result.gates)
        _move_summary(result)

    emit(as_json, result, human)


@cli.command("rollback")
@click.argument("channel")
@click.option(
    "--to",
    "to",
    metavar="TUPLE_ID",
    default=None,
    help="A tuple this channel served before (default: the previous distinct one).",
)
@click.option("--why", default=None, help="Why roll back (recorded in the history).")
@actor_option
@store_option
@policies_option
@json_option
@handle_errors
def rollback_cmd(
    channel: str,
    to: str | None,
    why: str | None,
    actor: str,
    store_url: str,
    policies_dir: Path,
    as_json: bool,
) -> None:
    """Point CHANNEL back at a tuple it served before.

    Moves no weight bytes: it checks the target's manifest is still in the store (one read)
    and swaps the pointer, so it takes the same time for any release size. Two rollbacks in a
    row swap back (like an undo). Refuses a target whose weights were deleted from the store.

    Exit codes: 0 moved (or already there), 4 target's manifest changed, 6 lost a race,
    7 unknown channel, target never on it, or target's weights gone.
    """
    result = rollback(get_store(store_url), channel, to=to, actor=actor, reason=why,
                      policy_channels=_policy_channels(policies_dir))
    emit(as_json, result, lambda: _move_summary(result))


def _policy_channels(policies_dir: Path) -> set[str] | None:
    """The channels the gate policy allows, or None when there is no readable policy here
    (a rollback needs none: it only returns to tuples that passed their gates)."""
    try:
        return set(load_gate_policy(policies_dir).channels)
    except K3AError:
        return None


def _history_row(e: HistoryEntry) -> list[str]:
    notes = [f"override {o.gate}: {o.reason}" for o in e.overrides]
    if e.approval is not None:
        notes.append(f"{e.approval.decision} by {e.approval.who}")
    return [
        str(e.seq),
        e.when.strftime("%Y-%m-%d %H:%M:%S"),
        e.action,
        e.tuple_id,
        e.previous_tuple_id or "-",
        e.who,
        "; ".join([e.why or "", *notes]).strip("; ") or "-",
    ]


@cli.command("history")
@click.argument("channel")
@store_option
@policies_option
@json_option
@handle_errors
def history_cmd(channel: str, store_url: str, policies_dir: Path, as_json: bool) -> None:
    """Every move of CHANNEL, oldest first: seq, when, action, tuple, previous, who, why.

    Exit codes: 0 ok, 7 unknown channel.
    """
    entries = history(get_store(store_url), channel, _policy_channels(policies_dir))
    emit(
        as_json,
        [e.model_dump(mode="json") for e in entries],
        lambda: _table(
            [_history_row(e) for e in entries],
            ["seq", "when (UTC)", "action", "tuple", "previous", "who", "why"],
        ),
    )


@cli.group("channels")
def channels_group() -> None:
    """Channel pointers in the store."""


@channels_group.command("list")
@store_option
@json_option
@handle_errors
def channels_list(store_url: str, as_json: bool) -> None:
    """Each channel with the tuple it points at and its last move."""
    pointers = list_channels(get_store(store_url))

    def human() -> None:
        if not pointers:
            click.echo("no channels yet: `k3a promote <tuple-id> <channel>` makes one")
            return
        _table(
            [
                [
                    p.channel,
                    p.tuple_id,
                    str(p.seq),
                    p.entry.action,
                    p.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
                    p.updated_by,
                ]
                for p in pointers
            ],
            ["channel", "tuple", "seq", "last", "when (UTC)", "by"],
        )

    emit(as_json, [p.model_dump(mode="json") for p in pointers], human)


@cli.command("gates")
@click.argument("tuple_id")
@click.argument("channel")
@policies_option
@store_option
@json_option
@handle_errors
def gates_cmd(
    tuple_id: str, channel: str, policies_dir: Path, store_url: str, as_json: bool
) -> None:
    """Dry run: the gates CHANNEL requires, run on TUPLE_ID. Writes nothing.

    Exit codes: 0 every gate passes, 5 at least one fails, 7 unknown tuple or channel,
    9 bad policy.
    """
    report = check_gates(get_store(store_url), tuple_id, channel, policies_dir=policies_dir)
    emit(as_json, report, lambda: _gate_table(report.results))
    if report.failed:
        names = ", ".join(r.name for r in report.failed)
        click.secho(f"{tuple_id} would not move onto {channel}: {names} failed", fg="red", err=True)
        raise SystemExit(GateFailed.exit_code)


@cli.group("review")
def review_group() -> None:
    """Record that you read a tuple's license or remote code (in POLICIES, to commit)."""


@review_group.command("license")
@click.argument("tuple_id")
@click.option("--by", "by", default=None, help="Your name: who read the license text.")
@click.option("--note", default=None, help="Anything the next reader should know.")
@click.option("--show", is_flag=True, help="Print the license text to read; record nothing.")
@policies_option
@store_option
@json_option
@handle_errors
def review_license_cmd(
    tuple_id: str,
    by: str | None,
    note: str | None,
    show: bool,
    policies_dir: Path,
    store_url: str,
    as_json: bool,
) -> None:
    """Record a review of TUPLE_ID's license text (by its sha256) in POLICIES/licenses/.

    Read the text first (`--show`), then record with `--by NAME`. Idempotent: a text already
    reviewed is not recorded again. Commit the file it writes.
    Exit codes: 0 ok, 4 manifest text does not match the tuple, 7 unknown tuple or no license,
    9 malformed review file.
    """
    if show:
        click.echo(license_text(get_store(store_url), tuple_id), nl=False)
        return
    if not by:
        raise click.UsageError("say who read the license: --by NAME (read it with --show)")
    outcome = review_license(
        get_store(store_url), tuple_id, by=by, note=note, policies_dir=policies_dir
    )

    def human() -> None:
        r = outcome.review
        if outcome.written:
            click.echo(f"recorded: license sha256 {r.sha256} reviewed by {r.reviewed_by}")
            click.echo(f"in {outcome.file}: commit it so the license gate sees it")
        else:
            click.echo(
                f"already reviewed: sha256 {r.sha256} by {r.reviewed_by} on {r.reviewed_on} "
                f"({outcome.file}); nothing written"
            )

    emit(as_json, outcome, human)


@review_group.command("code")
@click.argument("tuple_id")
@click.option("--by", "by", required=True, help="Your name: who read the *.py files.")
@click.option("--note", default=None, help="Anything the next reader should know.")
@policies_option
@store_option
@json_option
@handle_errors
def review_code_cmd(
    tuple_id: str, by: str, note: str | None, policies_dir: Path, store_url: str, as_json: bool
) -> None:
    """Record a review of every remote-code file (*.py) of TUPLE_ID's revision.

    Files are recorded by sha256 in POLICIES/code-reviews/; ones already reviewed are skipped.
    Exit codes: 0 ok, 7 unknown tuple or revision not staged, 9 malformed review file.
    """
    outcome = review_code(
        get_store(store_url), tuple_id, by=by, note=note, policies_dir=policies_dir
    )

    def human() -> None:
        for r in outcome.recorded:
            click.echo(f"recorded: {r.path} sha256 {r.sha256}")
        for r in outcome.already_reviewed:
            click.echo(f"already reviewed: {r.path} sha256 {r.sha256} by {r.reviewed_by}")
        if outcome.file:
            click.echo(f"in {outcome.file}: commit it so the remote_code gate sees it")
        elif not outcome.already_reviewed:
            click.echo("the revision has no remote code; nothing to review")

    emit(as_json, outcome, human)


@cli.group("eval")
def eval_group() -> None:
    """Evaluation reports attached to tuples (for the evaluation gate)."""


@eval_group.command("attach")
@click.argument("tuple_id")
@click.argument("report", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@actor_option
@store_option
@json_option
@handle_errors
def eval_attach(tuple_id: str, report: Path, actor: str, store_url: str, as_json: bool) -> None:
    """Attach REPORT (JSON with "suite", "passed", "total") to TUPLE_ID, once and for good.

    Attaching the same report again writes nothing. The evaluation gate judges the latest
    report attached. Exit codes: 0 ok, 7 unknown tuple, 9 invalid report.
    """
    raw = parse_report(report.read_bytes(), str(report))
    record, written = attach_evaluation(get_store(store_url), tuple_id, raw, by=actor)
    parsed = record.parsed()

    def human() -> None:
        verb = "attached" if written else "already attached (nothing written)"
        click.echo(
            f"{verb}: {parsed.suite} {parsed.passed}/{parsed.total} = {parsed.pass_rate:.1%} "
            f"to {tuple_id} (report sha256 {record.report_sha256[:12]})"
        )

    emit(as_json, {"written": written, "record": record.model_dump(mode="json")}, human)


@eval_group.command("list")
@click.argument("tuple_id")
@store_option
@json_option
@handle_errors
def eval_list(tuple_id: str, store_url: str, as_json: bool) -> None:
    """Evaluation reports attached to TUPLE_ID, oldest first."""
    records = list_evaluations(get_store(store_url), tuple_id)

    def human() -> None:
        rows = []
        for r in records:
            p = r.parsed()
            rows.append(
                [
                    r.attached_at.strftime("%Y-%m-%d %H:%M:%S"),
                    p.suite,
                    f"{p.passed}/{p.total}",
                    f"{p.pass_rate:.1%}",
                    r.attached_by,
                    r.report_sha256[:12],
                ]
            )
        _table(rows, ["attached (UTC)", "suite", "passed", "rate", "by", "report"])

    emit(as_json, [r.model_dump(mode="json") for r in records], human)
