"""The gate registry: name -> check, the report of a run, and the one override rule.

Adding a gate is one module exposing ``check(ctx) -> GateResult``, one line in :data:`GATES`,
and its name under a channel in ``policies/promotion-gates.yaml`` (with its settings, if it has
any, in the channel policy model of ``releases/policies.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, computed_field

from k3artifacts.errors import ConfigError, GateFailed, NotFound
from k3artifacts.promotion.gates import (
    artifact,
    duties,
    evaluation,
    image_scan,
    infrastructure,
    license,
    order,
    remote_code,
    renderable,
    signature,
    traffic,
)
from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.releases.channels import GateResult, Override, check_channel
from k3artifacts.releases.policies import (
    GATES_FILE,
    ChannelPolicy,
    GatePolicy,
    load_gate_policy,
)
from k3artifacts.releases.tuples import ReleaseTuple, TupleStore
from k3artifacts.serving.render import TARGETS
from k3artifacts.stores.base import Store


@dataclass(frozen=True)
class Gate:
    check: Callable[[GateContext], GateResult]
    #: Whether a failure may be let through with a recorded reason. Not for gates whose
    #: failure no reason can make acceptable: a tuple no cluster can run, a promoter approving
    #: their own review.
    overridable: bool = True


GATES: dict[str, Gate] = {
    artifact.NAME: Gate(artifact.check),
    license.NAME: Gate(license.check),
    remote_code.NAME: Gate(remote_code.check),
    evaluation.NAME: Gate(evaluation.check),
    renderable.NAME: Gate(renderable.check, overridable=False),
    order.NAME: Gate(order.check),
    duties.NAME: Gate(duties.check, overridable=False),
    signature.NAME: Gate(signature.check),
    traffic.NAME: Gate(traffic.check),
    infrastructure.NAME: Gate(infrastructure.check),
    image_scan.NAME: Gate(image_scan.check),
}


class GateReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    tuple_id: str
    channel: str
    results: list[GateResult]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[GateResult]:
        return [r for r in self.results if not r.passed]


GATE_TABLE_HEADER = ["gate", "result", "reason"]


def gate_rows(results: list[GateResult]) -> list[list[str]]:
    """The gate results table every front end shows (terminal, flow artifact): one wording."""
    return [
        [r.name, "pass" if r.passed else ("FAIL (overridden)" if r.overridden else "FAIL"),
         r.reason]
        for r in results
    ]


def channel_policy(policy: GatePolicy, channel: str, policies_dir: Path) -> ChannelPolicy:
    """``channel``'s policy, its gates and targets checked against what this code knows."""
    check_channel(channel)
    path = Path(policies_dir) / GATES_FILE
    if channel not in policy.channels:
        configured = ", ".join(sorted(policy.channels)) or "none"
        raise NotFound(
            f"channel {channel!r} is not configured in {path} (configured: {configured})",
            hint=f"check the spelling, or add `{channel}: {{gates: [...]}}` under channels:",
        )
    chan = policy.channels[channel]
    unknown = [g for g in chan.gates if g not in GATES]
    if unknown:
        raise ConfigError(
            f"policy file {path}: channel {channel} names unknown gate(s) {', '.join(unknown)}",
            hint=f"gates: {', '.join(GATES)}",
        )
    bad_targets = [t for t in chan.targets if t not in TARGETS]
    if bad_targets:
        raise ConfigError(
            f"policy file {path}: channel {channel} names unknown target(s) "
            f"{', '.join(bad_targets)}",
            hint=f"targets: {', '.join(TARGETS)}",
        )
    if chan.order is not None and chan.order.after == channel:
        raise ConfigError(f"policy file {path}: channel {channel} cannot come after itself")
    return chan


def run_gates(ctx: GateContext) -> GateReport:
    results = [GATES[name].check(ctx) for name in ctx.policy.gates]
    return GateReport(tuple_id=ctx.release.id, channel=ctx.channel, results=results)


def check_gates(
    store: Store,
    tuple_id: str,
    channel: str,
    *,
    policies_dir: Path,
    actor: str | None = None,
    now: datetime | None = None,
) -> GateReport:
    """Run the gates ``channel`` requires on ``tuple_id``. Nothing is written."""
    chan = channel_policy(load_gate_policy(policies_dir), channel, policies_dir)
    release = TupleStore(store).get(tuple_id)
    return run_gates(context(store, release, channel, chan, policies_dir, actor, now))


def context(
    store: Store,
    release: ReleaseTuple,
    channel: str,
    chan: ChannelPolicy,
    policies_dir: Path,
    actor: str | None,
    now: datetime | None,
) -> GateContext:
    extra = {} if now is None else {"now": now}
    return GateContext(
        store=store,
        release=release,
        channel=channel,
        policy=chan,
        policies_dir=Path(policies_dir),
        actor=actor,
        **extra,
    )


def check_overrides(chan: ChannelPolicy, channel: str, overrides: Mapping[str, str]) -> None:
    """Refuse, before any gate runs, an override the rule does not allow (exit 9)."""
    for gate, why in overrides.items():
        if gate not in chan.gates:
            raise ConfigError(
                f"cannot override gate {gate!r}: channel {channel} requires only "
                f"{', '.join(chan.gates) or 'no gates'}"
            )
        if not GATES[gate].overridable:
            raise ConfigError(
                f"gate {gate!r} cannot be overridden: fix what it reports instead",
                hint="the renderable and separation_of_duties gates have no override",
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
    chan: ChannelPolicy, report: GateReport, overrides: Mapping[str, str]
) -> Verdict:
    """The one override rule: every failed gate must be overridden (with a reason, and only
    where the gate allows it), or the move is refused (GateFailed, exit 5) listing them all."""
    check_overrides(chan, report.channel, overrides)
    blocking = [r for r in report.failed if r.name not in overrides]
    if blocking:
        lines = "\n".join(f"  {r.name}: {r.reason}" for r in blocking)
        fixable = [r.name for r in blocking if GATES[r.name].overridable]
        how = (
            "fix what each gate names, or override one with "
            '`--override-gate NAME --reason "why"` (recorded in the channel history)'
        )
        raise GateFailed(
            f"{report.tuple_id} cannot move onto {report.channel}: {len(blocking)} gate(s) "
            f"failed:\n{lines}",
            hint=how if fixable else "fix what each gate names (these gates have no override)",
        )
    failed = {r.name for r in report.failed}
    return Verdict(
        gates=[r.model_copy(update={"overridden": r.name in failed}) for r in report.results],
        used=[Override(gate=g, reason=overrides[g]) for g in chan.gates if g in failed],
        unused=sorted(set(overrides) - failed),
    )
