"""``k3a revision gc``: retire published revisions no channel can reach (dry run unless --apply:
the plan, ``releases/retention.py``; the act, ``warm/retention.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from k3artifacts.cli.common import acting_here, emit, get_store, json_option, store_option
from k3artifacts.cli.exits import exits

if TYPE_CHECKING:
    from k3artifacts.releases.retention import RevisionVerdict


@exits((0, "done (or plan shown)"), (8, "store unreachable"), (9, "bad policy"))
@click.command("gc")
@click.option("--apply", "apply_", is_flag=True, help="Delete what the plan retires.")
@click.option("--dry-run", is_flag=True,
              help="Print the plan and delete nothing (what runs without --apply, said).")
@click.option("--keep", type=click.IntRange(min=1), default=None,
              help="Keep the newest N revisions of each repo. Default: retention.keep.")
@click.option("--keep-days", type=click.FloatRange(min=0), default=None,
              help="Keep revisions published less than D days ago. Default: retention.keep_days.")
@store_option
@json_option
def gc_cmd(apply_: bool, dry_run: bool, keep: int | None, keep_days: float | None,
           store_url: str, as_json: bool) -> None:
    """Retire published revisions by the retention section of the store's policy
    (`k3a policy show`).

    Never retires a revision that a channel's current tuple, or the tuple of any entry in the
    channel's rollback window (its newest `rollback_window` history entries), is bound to.
    Without --apply it only prints the plan. With it, each revision is tombstoned, checked
    again against promotions in flight and every channel, then deleted (manifest first); a
    promotion racing gc is refused or keeps the revision. On S3 the current versions go; the
    noncurrent ones expire by the lifecycle rule `k3a bootstrap --noncurrent-days` sets.
    """
    if apply_ and dry_run:
        raise click.UsageError("--dry-run and --apply: choose one (without either, a dry run)")
    from k3artifacts.releases.retention import plan_gc
    from k3artifacts.warm.retention import gc
    store = get_store(store_url)
    plan = plan_gc(store, keep=keep, keep_days=keep_days)
    verdicts = gc(store, plan, by=acting_here(store).actor) if apply_ else plan.verdicts
    emit(as_json, [v.model_dump(mode="json") for v in verdicts],
         lambda: _print(verdicts, apply_))


def _print(verdicts: list[RevisionVerdict], applied: bool) -> None:
    from k3artifacts.reporting.progress import human_size
    if not verdicts:
        click.echo("no published revisions")
        return
    freed = 0
    for v in verdicts:
        size = human_size(v.bytes)
        line = f"{v.action:7} {v.repo_id}@{v.commit[:12]}  {size:>10}  {v.published_at:%Y-%m-%d}"
        if v.action in ("retire", "retired"):
            freed += v.freed
            verb = "frees" if v.action == "retired" else "would free"
            shared = f" ({human_size(v.bytes - v.freed)} shared with kept revisions stays)" \
                if v.freed < v.bytes else ""
            click.echo(f"{line}  {verb} {human_size(v.freed)}{shared}")
        else:
            click.echo(f"{line}  {v.reason}")
    total = human_size(freed)
    click.echo(f"freed {total}" if applied else f"dry run: would free {total}; --apply to act")
