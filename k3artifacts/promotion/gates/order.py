"""``promotion_order``: the tuple was promoted to an earlier channel first (production after
staging), stayed there long enough, and passed the named gates there.

Read from the earlier channel's history, the record of what it served and when: a stint runs
from a promotion of the tuple to the next move of that channel (or now, if still current).
"""

from __future__ import annotations

from datetime import timedelta

from k3artifacts.errors import NotFound
from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.releases.channels import HistoryEntry, history

NAME = "promotion_order"


def _hours(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 3600:.1f} h"


def _unpassed(entry: HistoryEntry, required: list[str]) -> list[str]:
    ok = {g.name for g in entry.gates if g.passed and not g.overridden}
    return [name for name in required if name not in ok]


def check(ctx: GateContext) -> GateResult:
    order = ctx.policy.order
    assert order is not None  # ChannelPolicy refuses the gate without its settings
    tid, after = ctx.release.id, order.after
    first_step = f"`k3a promote {tid} {after}` first"
    try:
        entries = history(ctx.store, after)
    except NotFound:
        entries = []
    stints = []
    for i, entry in enumerate(entries):
        if entry.action == "promote" and entry.tuple_id == tid:
            end = entries[i + 1].when if i + 1 < len(entries) else ctx.now
            stints.append((entry, end - entry.when))
    if not stints:
        return GateResult(
            name=NAME, passed=False, reason=f"{tid} was never promoted to {after}; {first_step}"
        )
    good = [(e, d) for e, d in stints if not _unpassed(e, order.passed)]
    if not good:
        entry = stints[-1][0]
        missing = ", ".join(_unpassed(entry, order.passed))
        return GateResult(
            name=NAME,
            passed=False,
            reason=f"on {after} (#{entry.seq}) {missing} did not pass (overridden or not run); "
            f"promote it to {after} again once it passes there",
        )
    entry, stayed = max(good, key=lambda s: s[1])
    need = timedelta(hours=order.min_hours)
    if stayed < need:
        return GateResult(
            name=NAME,
            passed=False,
            reason=f"on {after} for {_hours(stayed)} since #{entry.seq} "
            f"({entry.when:%Y-%m-%d %H:%M} UTC); the policy needs {_hours(need)}: "
            f"promote after {entry.when + need:%Y-%m-%d %H:%M} UTC",
        )
    return GateResult(
        name=NAME,
        passed=True,
        reason=f"on {after} from #{entry.seq} ({entry.when:%Y-%m-%d %H:%M} UTC) for "
        f"{_hours(stayed)} >= {_hours(need)}",
    )
