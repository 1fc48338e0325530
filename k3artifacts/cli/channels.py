"""``k3a promote | rollback | approve | history | channels | gates | review``: moving channels.

Each command resolves who acts (``policy/acting.py``), calls one library move (``promotion/``,
``policy/decide.py``, ``releases/reviewing.py``) and shows its result; what judges is the
store's policy, never a local directory: ``--policies`` here is refused with the way to
propose a change instead."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from k3artifacts.cli.common import (
    acting_here,
    emit,
    get_store,
    json_option,
    local_policies_option,
    refuse_local_policies,
    store_option,
    typed_actor_option,
)
from k3artifacts.cli.exits import exits
from k3artifacts.cli.params import CHANNEL, TUPLE_ID
from k3artifacts.cli.single_node import run_single_node, single_node_options

if TYPE_CHECKING:
    from k3artifacts.policy.actor import Acting
    from k3artifacts.policy.results import GateReport, GateResult
    from k3artifacts.promotion.moves import MoveResult
    from k3artifacts.promotion.requests import ApprovalRequest
    from k3artifacts.releases.channels import HistoryEntry
    from k3artifacts.stores.base import Store

by_option = typed_actor_option

def _acting(store: Store, by: str | None) -> Acting:
    return acting_here(store, by)


def _refuse_local_policies(local: Path | None, store: Store) -> None:
    refuse_local_policies(local, store, "moves are judged by")


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _gate_table(results: list[GateResult]) -> None:
    from k3artifacts.policy.results import GATE_TABLE_HEADER, gate_rows
    if results:
        _table(gate_rows(results), GATE_TABLE_HEADER)
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
    approved = f", approved by {e.approval.who}" if e.approval else ""
    click.echo(
        f"{result.channel}: {result.previous_tuple_id or '(empty)'} -> {result.tuple_id} "
        f"({e.action} #{e.seq} by {e.who}{approved}; policy v{e.policy_version} "
        f"{(e.policy_digest or '')[:12]})"
    )


dry_run_option = click.option(
    "--dry-run", is_flag=True,
    help="Plan the move as it would run (who moves, the checks, the pointer it would swap) and "
    "print the plan; write nothing (no record, no pin, no key).")


def _planned(as_json: bool, *, channel: str, current: str | None, target: str,
             checks: list[GateResult], policy: str, action: str) -> None:
    """A move's plan, as `--dry-run` prints it."""
    moves = current != target
    plan = {"dry_run": True, "action": action, "channel": channel, "from": current,
            "to": target, "moves": moves, "policy": policy,
            "checks": [check.model_dump(mode="json") for check in checks]}

    def human() -> None:
        if checks:
            _gate_table(checks)
        said = (f"would move {channel}: {current or '(empty)'} -> {target}" if moves
                else f"{channel} already points at {target}: nothing to move")
        click.echo(f"dry run ({action}): {said}; judged by {policy}; nothing written")

    emit(as_json, plan, human)


def _dry_run_alone(dry_run: bool, **others: bool) -> None:
    given = [f"--{name.replace('_', '-')}" for name, on in others.items() if on]
    if dry_run and given:
        raise click.UsageError(f"--dry-run plans the move itself; it does not go with "
                               f"{', '.join(given)}")


def _requested(request: ApprovalRequest, then: str, as_json: bool) -> None:
    emit(as_json, request, lambda: click.echo(
        f"requested: {request.subject()} as {request.id}\n"
        f"next: another release engineer runs `k3a approve {request.id}`; then `{then} "
        f"--approval {request.id}`"))


@exits(
    (0, "moved (or already there, or a request recorded)"),
    (4, "the channel pointer does not match its history"),
    (5, "a gate failed"),
    (6, "lost a race (another move won; nothing written)"),
    (7, "unknown tuple or channel not in the policy"),
    (9, "bad override, or a local --policies"),
)
@click.command("promote")
@click.argument("tuple_id", type=TUPLE_ID)
@click.argument("channel", type=CHANNEL)
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
@click.option("--approval", "approval", metavar="REQUEST", default=None,
              help="An approved request (`k3a approve REQUEST`) for this move: the approver is "
              "then the promoter separation of duties judges.")
@click.option("--request-approval", "request_approval_", is_flag=True,
              help="Run the gates, record a request for approval of this promotion (the one "
              "the promote flow records) and print its id; moves nothing.")
@dry_run_option
@by_option
@local_policies_option
@store_option
@json_option
def promote_cmd(
    tuple_id: str,
    channel: str,
    override_gates: tuple[str, ...],
    override_reasons: tuple[str, ...],
    why: str | None,
    approval: str | None,
    request_approval_: bool,
    dry_run: bool,
    by: str | None,
    local_policies: Path | None,
    store_url: str,
    as_json: bool,
) -> None:
    """Move CHANNEL to TUPLE_ID after the channel's gates pass.

    The gates are the store's policy (`k3a policy show`; seeded from the packaged defaults on
    first use); each failed gate is listed with its reason and the pointer does not move,
    unless that gate is overridden with
    `--override-gate NAME --reason "..."`. The move is a compare-and-swap: if another promotion
    or rollback moved the channel meanwhile, this one writes nothing and names the winner.
    Promoting the tuple the channel already points at succeeds and writes nothing.

    `--request-approval` runs the gates and records a request for approval of this move;
    another release engineer runs `k3a approve REQUEST`, then `--approval REQUEST` moves the
    channel with the approver as the promoter.

    \b
    Example:
      k3a promote k3t-0123456789abcdef01234567 production --why "eval passed" \\
          --override-gate evaluation --reason "suite flaky, manual check by bob"
    """
    if len(override_gates) != len(override_reasons):
        raise click.UsageError("give exactly one --reason for each --override-gate")
    _dry_run_alone(dry_run, request_approval=request_approval_)
    overrides = dict(zip(override_gates, override_reasons, strict=True))
    store = get_store(store_url)
    _refuse_local_policies(local_policies, store)
    me = _acting(store, by)
    if dry_run:
        _promote_dry_run(store, tuple_id, channel, me, why, overrides, approval, as_json)
        return
    if request_approval_:
        from k3artifacts.promotion.requests import request_move
        _, request = request_move(store, "promote", channel, tuple_id=tuple_id,
                                  overrides=overrides, requested_by=me, why=why)
        _requested(request, f"k3a promote {tuple_id} {channel}", as_json)
        return
    from k3artifacts.promotion.moves import promote
    result = promote(store, tuple_id, channel, acting=me, reason=why, overrides=overrides,
                     approval=approval)

    def human() -> None:
        _gate_table(result.gates)
        _move_summary(result)

    emit(as_json, result, human)


def _promote_dry_run(store: Store, tuple_id: str, channel: str, me: Acting, why: str | None,
                     overrides: dict[str, str], approval: str | None, as_json: bool) -> None:
    from k3artifacts.errors import GatesRefused
    from k3artifacts.promotion.moves import plan_promote
    try:
        plan = plan_promote(store, tuple_id, channel, acting=me, reason=why, overrides=overrides,
                            approval=approval)
    except GatesRefused as refused:
        # The plan stops at its gates: the whole table beside the refusal, as `k3a gates`.
        report = refused.report
        emit(as_json, report, lambda: _gate_table(report.results))
        raise
    _planned(as_json, channel=channel, current=plan.state.tuple_id, target=tuple_id,
             checks=plan.gates, policy=plan.policy.label(), action="promote")


@exits(
    (0, "moved (or already there, or a request recorded)"),
    (4, "target's manifest changed or the pointer does not match its history"),
    (5, "approval needed, rejected or for another move (with --single-node: the procedure stopped "
        "at a failed step, recorded)"),
    6,
    (7, "unknown channel, target never on it, or target's weights gone"),
    (9, "(--single-node) the node's options are missing"),
)
@click.command("rollback")
@click.argument("channel", type=CHANNEL)
@click.option(
    "--to",
    "to",
    metavar="TUPLE_ID",
    type=TUPLE_ID,
    default=None,
    help="A tuple this channel served before (default: the previous distinct one).",
)
@click.option("--why", default=None, help="Why roll back (recorded in the history).")
@single_node_options
@click.option("--approval", "approval", metavar="REQUEST", default=None,
              help="An approved request for this rollback (`k3a approve REQUEST`), where the "
              "store's policy sets rollback_approval for the channel.")
@click.option("--request-approval", "request_approval_", is_flag=True,
              help="Record a request for approval of this rollback (the one the rollback flow "
              "records) and print its id; moves nothing.")
@dry_run_option
@by_option
@local_policies_option
@store_option
@json_option
def rollback_cmd(
    channel: str,
    to: str | None,
    why: str | None,
    approval: str | None,
    request_approval_: bool,
    dry_run: bool,
    by: str | None,
    local_policies: Path | None,
    store_url: str,
    as_json: bool,
    **node: Any,
) -> None:
    """Point CHANNEL back at a tuple it served before.

    Moves no weight bytes: it checks the target's manifest is still in the store (one read)
    and swaps the pointer, so it takes the same time for any release size. Two rollbacks in a
    row swap back (like an undo). Refuses a target whose weights were deleted from the store.

    Where the store's policy sets rollback_approval for CHANNEL, the rollback needs an
    approval record: `--request-approval` records the request and prints its id, another
    release engineer runs `k3a approve REQUEST`, then `--approval REQUEST` moves the channel.
    """
    _dry_run_alone(dry_run, request_approval=request_approval_, single_node=node["single_node"])
    store = get_store(store_url)
    _refuse_local_policies(local_policies, store)
    me = _acting(store, by)
    if dry_run:
        from k3artifacts.promotion.rollback import plan_rollback
        plan = plan_rollback(store, channel, to=to, acting=me, reason=why, approval=approval)
        _planned(as_json, channel=channel, current=plan.state.tuple_id, target=plan.tuple_id,
                 checks=plan.checks, policy=plan.policy.label(), action="rollback")
        return
    if node["single_node"]:
        run_single_node(store, channel, to=to, why=why, acting=me, approval=approval,
                        as_json=as_json, **node)
        return
    if request_approval_:
        from k3artifacts.promotion.requests import request_move
        plan, request = request_move(store, "rollback", channel, tuple_id=to,
                                     requested_by=me, why=why)
        _requested(request, f"k3a rollback {channel} --to {plan.tuple_id}", as_json)
        return
    from k3artifacts.promotion.rollback import rollback
    result = rollback(store, channel, to=to, acting=me, reason=why, approval=approval)
    emit(as_json, result, lambda: _move_summary(result))


@exits(
    (0, "recorded (or shown)"),
    (4, "the request (or an answer) is not a record the policy trusts (written by hand, signed by "
        "a key it does not trust for it), or the proposed change in the store is not the one the "
        "request asks for"),
    (5, "you asked for it yourself"),
    (6, "already answered or the policy changed since"),
    (7, "no such request"),
    (9, "your key is no identity of the policy, or lacks the role approve"),
)
@click.command("approve")
@click.argument("request_id", metavar="REQUEST")
@click.option("--reject", is_flag=True, help="Answer no: the move or change will not happen.")
@click.option("--reason", default=None, help="Why (recorded with the decision).")
@click.option("--show", is_flag=True, help="Print the request; record nothing.")
@by_option
@store_option
@json_option
def approve_cmd(request_id: str, reject: bool, reason: str | None, show: bool, by: str | None,
                store_url: str, as_json: bool) -> None:
    """Answer an approval request (a flow's promotion or rollback, a rollback the policy wants
    approved, a policy change), once, signed by your key: the identity of the store's policy
    that lists it, with the role approve. The requester cannot approve their own request.
    Approving a policy change as one of the store's root identities also signs the change: a
    change that is not provably stricter needs the root's threshold of signatures before
    `k3a policy apply`.
    """
    from k3artifacts.policy.change import answer
    from k3artifacts.policy.decide import show_request
    store = get_store(store_url)
    request = show_request(store, request_id)
    if show:
        emit(as_json, request, lambda: click.echo(
            f"{request.id}: {request.subject()}\nrequested by {request.requested_by.label()} "
            f"at {request.requested_at:%Y-%m-%d %H:%M}"
            + (f" for {request.requested_for!r} (typed)" if request.requested_for else "")
            + (f"\nwhy: {request.why}" if request.why else "")
            + "".join(f"\nneeds approval: {n}" for n in request.needs)))
        return
    decision, signed = answer(store, request_id, by=_acting(store, by), approve=not reject,
                              reason=reason)
    emit(as_json, {**decision.model_dump(mode="json"), "signed_by": sorted(signed)},
         lambda: click.echo(
             f"{decision.decision}: {request.subject()} ({request.id}) by {decision.by.label()}"
             + (f"\nthe change is signed by root identities: {', '.join(sorted(signed))}"
                if signed else "")))


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
        f"v{e.policy_version} {e.policy_digest[:12]}" if e.policy_digest else "-",
        "; ".join([e.why or "", *notes]).strip("; ") or "-",
    ]


@click.group("channel")
def channel_group() -> None:
    """Channel pointers in the store and the history of their moves. `k3a channels list` and
    `k3a history CHANNEL` are the old spellings."""


@exits(0, (4, "the pointer does not match its history"), (7, "unknown channel"))
@channel_group.command("history")
@click.argument("channel", type=CHANNEL)
@store_option
@json_option
def history_cmd(channel: str, store_url: str, as_json: bool) -> None:
    """Every move of CHANNEL, oldest first: seq, when, action, tuple, previous, who, policy,
    why.
    """
    from k3artifacts.policy.change import policy_in_force
    from k3artifacts.releases.channels import history
    store = get_store(store_url)
    entries = history(store, channel, policy_in_force(store).document.gates.channels)
    emit(
        as_json,
        [e.model_dump(mode="json") for e in entries],
        lambda: _table(
            [_history_row(e) for e in entries],
            ["seq", "when (UTC)", "action", "tuple", "previous", "who", "policy", "why"],
        ),
    )


@exits(0, (4, "a channel record refused (its pointer or history edited in the store)"),
       (7, "no store there"), 8)
@channel_group.command("list")
@store_option
@json_option
def channels_list(store_url: str, as_json: bool) -> None:
    """Each channel with the tuple it points at and its last move."""
    from k3artifacts.releases.channels import list_channels
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


@exits(
    (0, "every gate passes"),
    (4, "the pointer does not match its history"),
    (5, "at least one fails"),
    (6, "gc is retiring the tuple's weights"),
    (7, "unknown tuple or channel, or weights gone"),
    (9, "a local --policies"),
)
@click.command("gates")
@click.argument("tuple_id", type=TUPLE_ID)
@click.argument("channel", type=CHANNEL)
@by_option
@local_policies_option
@store_option
@json_option
def gates_cmd(
    tuple_id: str, channel: str, by: str | None, local_policies: Path | None, store_url: str,
    as_json: bool,
) -> None:
    """Dry run: the gates the store's policy requires of CHANNEL, run on TUPLE_ID, with you as
    the promoter: the plan of `k3a promote`, without its act. Writes nothing; says which policy
    version judged.
    """
    from k3artifacts.errors import GatesRefused
    from k3artifacts.policy.results import policy_label
    from k3artifacts.promotion.moves import plan_promote
    store = get_store(store_url)
    _refuse_local_policies(local_policies, store)
    me = _acting(store, by)

    def show(report: GateReport) -> None:
        def human() -> None:
            _gate_table(report.results)
            click.echo("policy: " + policy_label(report.policy_version or 0,
                                                 report.policy_digest or ""))

        emit(as_json, report, human)

    try:
        plan = plan_promote(store, tuple_id, channel, acting=me)
    except GatesRefused as refused:
        show(refused.report)
        raise
    show(plan.report)


@click.group("review")
def review_group() -> None:
    """Record that you read a tuple's license or remote code (a create-once record in the
    store, signed by your key: the license and remote_code gates read only these)."""


@exits(
    0,
    (4, "stored text does not match the tuple, or a review record the policy does not trust"),
    (7, "unknown tuple or no license"),
    (9, "your key is no identity of the policy, or lacks the role review"),
)
@review_group.command("license")
@click.argument("tuple_id", type=TUPLE_ID)
@by_option
@click.option("--note", default=None, help="Anything the next reader should know.")
@click.option("--show", is_flag=True, help="Print the license text to read; record nothing.")
@store_option
@json_option
def review_license_cmd(
    tuple_id: str,
    by: str | None,
    note: str | None,
    show: bool,
    store_url: str,
    as_json: bool,
) -> None:
    """Record that you reviewed TUPLE_ID's license text (by its sha256), in the store under
    releases/reviews/license/.

    Read the text first (`--show`), then record. The reviewer is the identity whose key signs
    the review (role review), so the separation_of_duties gate can tell you from the
    promoter. Idempotent: a text already reviewed is not recorded again.
    """
    from k3artifacts.releases.reviewing import license_text, review_license
    store = get_store(store_url)
    if show:
        click.echo(license_text(store, tuple_id), nl=False)
        return
    outcome = review_license(store, tuple_id, by=_acting(store, by), note=note)

    def human() -> None:
        r = outcome.review
        if outcome.written:
            click.echo(f"recorded: license sha256 {r.sha256} reviewed by {r.reviewed_by}")
            click.echo(f"in {store.url}: {outcome.key}")
        else:
            click.echo(
                f"already reviewed: sha256 {r.sha256} by {r.reviewed_by} on "
                f"{r.reviewed_at:%Y-%m-%d} ({outcome.key}); nothing written"
            )

    emit(as_json, outcome, human)


@exits(
    0,
    (4, "a review record the policy does not trust"),
    (7, "unknown tuple or revision not staged"),
    (9, "your key is no identity of the policy, or lacks the role review"),
)
@review_group.command("code")
@click.argument("tuple_id", type=TUPLE_ID)
@by_option
@click.option("--note", default=None, help="Anything the next reader should know.")
@store_option
@json_option
def review_code_cmd(
    tuple_id: str, by: str | None, note: str | None, store_url: str, as_json: bool,
) -> None:
    """Record that you reviewed every remote-code file (*.py) of TUPLE_ID's revision.

    One record per file sha256 in the store (releases/reviews/code/), signed by your key;
    files already reviewed are skipped.
    """
    from k3artifacts.releases.reviewing import review_code
    store = get_store(store_url)
    outcome = review_code(store, tuple_id, by=_acting(store, by), note=note)

    def human() -> None:
        for r in outcome.recorded:
            click.echo(f"recorded: {r.path} sha256 {r.sha256} reviewed by {r.reviewed_by}")
        for r in outcome.already_reviewed:
            click.echo(f"already reviewed: {r.path} sha256 {r.sha256} by {r.reviewed_by}")
        if not outcome.recorded and not outcome.already_reviewed:
            click.echo("the revision has no remote code; nothing to review")

    emit(as_json, outcome, human)
