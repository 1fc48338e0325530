"""The gate registry: every gate's name and whether a failure may be overridden, and the one
override rule every mover applies.

The checks themselves are in :mod:`k3artifacts.promotion.gates` (one module per gate, bound
to these names there); the policy model refuses a name not listed here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from k3artifacts.errors import ConfigError, GatesRefused
from k3artifacts.policy.results import GateReport, GateResult, Override


@dataclass(frozen=True)
class GateRule:
    #: Whether a failure may be let through with a recorded reason. Not for gates whose
    #: failure no reason can make acceptable: a tuple no cluster can run, a promoter approving
    #: their own review.
    overridable: bool = True


GATE_RULES: dict[str, GateRule] = {
    "artifact": GateRule(),
    "license": GateRule(),
    "remote_code": GateRule(),
    "evaluation": GateRule(),
    "renderable": GateRule(overridable=False),
    "promotion_order": GateRule(),
    "separation_of_duties": GateRule(overridable=False),
    "signature": GateRule(),
    "traffic": GateRule(),
    "infrastructure": GateRule(),
    "image_scan": GateRule(),
}


def overridable(name: str) -> bool:
    return GATE_RULES[name].overridable


def check_overrides(gates: Collection[str], channel: str, overrides: Mapping[str, str]) -> None:
    """Refuse, before any gate runs, an override the rule does not allow (exit 9)."""
    for gate, why in overrides.items():
        if gate not in gates:
            raise ConfigError(
                f"cannot override gate {gate!r}: channel {channel} requires only "
                f"{', '.join(gates) or 'no gates'}"
            )
        if not overridable(gate):
            fixed = ", ".join(n for n in GATE_RULES if not overridable(n))
            raise ConfigError(
                f"gate {gate!r} cannot be overridden: fix what it reports instead",
                hint=f"these gates have no override: {fixed}",
            )
        if not why.strip():
            raise ConfigError(f"overriding gate {gate!r} needs a reason")


@dataclass(frozen=True)
class Verdict:
    """A gate report after the overrides: what the history entry records."""

    gates: list[GateResult]
    used: list[Override]
    #: Overrides given for gates that passed anyway; not recorded.
    unused: list[str]


def apply_overrides(
    gates: Collection[str], report: GateReport, overrides: Mapping[str, str]
) -> Verdict:
    """The one override rule: every failed gate must be overridden (with a reason, and only
    where the gate allows it), or the move is refused (GatesRefused, exit 5) listing them all,
    with the whole report; the hint offers an override only for the gates that have one."""
    check_overrides(gates, report.channel, overrides)
    blocking = [r for r in report.failed if r.name not in overrides]
    if blocking:
        lines = "\n".join(f"  {r.name}: {r.reason}" for r in blocking)
        fixable = [r.name for r in blocking if overridable(r.name)]
        fixed = [r.name for r in blocking if not overridable(r.name)]
        if not fixable:
            how = "fix what each gate names (these gates have no override)"
        else:
            how = (f"fix what each gate names, or override {' / '.join(fixable)} with "
                   '`--override-gate NAME --reason "why"` (recorded in the channel history)')
            if fixed:
                how += f"; {', '.join(fixed)} cannot be overridden"
        raise GatesRefused(
            f"{report.tuple_id} cannot move onto {report.channel}: {len(blocking)} gate(s) "
            f"failed:\n{lines}",
            report=report,
            hint=how,
        )
    failed = {r.name for r in report.failed}
    return Verdict(
        gates=[r.model_copy(update={"overridden": r.name in failed}) for r in report.results],
        used=[Override(gate=g, reason=overrides[g]) for g in gates if g in failed],
        unused=sorted(set(overrides) - failed),
    )
