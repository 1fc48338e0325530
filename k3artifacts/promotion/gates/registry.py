"""The gates' checks, bound to the names of the gate registry (``policy/gates.py``), and the
run of a channel's gates as the store's policy says.

Adding a gate is one module exposing ``check(ctx) -> GateResult``, one line in :data:`CHECKS`,
its name and override rule in ``policy/gates.py``, its settings (if any) in the channel policy
model (``policy/model.py``) and its name under a channel in the store's policy (`k3a policy
propose`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

from k3artifacts.errors import ConfigError, NotFound
from k3artifacts.policy.actor import Actor
from k3artifacts.policy.gates import GATE_RULES
from k3artifacts.policy.model import ChannelPolicy
from k3artifacts.policy.record import InForce
from k3artifacts.policy.results import GateReport, GateResult
from k3artifacts.policy.signed import RecordTrust
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
from k3artifacts.promotion.gates.evidence import judge_signers
from k3artifacts.releases.channels import check_channel
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.serving.render import TARGETS
from k3artifacts.stores.base import Store

CHECKS: dict[str, Callable[[GateContext], GateResult]] = {
    artifact.NAME: artifact.check,
    license.NAME: license.check,
    remote_code.NAME: remote_code.check,
    evaluation.NAME: evaluation.check,
    renderable.NAME: renderable.check,
    order.NAME: order.check,
    duties.NAME: duties.check,
    signature.NAME: signature.check,
    traffic.NAME: traffic.check,
    infrastructure.NAME: infrastructure.check,
    image_scan.NAME: image_scan.check,
}
assert set(CHECKS) == set(GATE_RULES), "every registered gate has exactly one check"


def channel_policy(policy: InForce, channel: str) -> ChannelPolicy:
    """``channel``'s section of the policy in force, its targets checked against this code."""
    check_channel(channel)
    gates = policy.document.gates
    where = f"the store's policy, {policy.label()}"
    if channel not in gates.channels:
        configured = ", ".join(sorted(gates.channels)) or "none"
        raise NotFound(
            f"channel {channel!r} is not configured in {where} (configured: {configured})",
            hint="check the spelling, or add the channel to the policy: `k3a policy propose DIR`",
        )
    chan = gates.channels[channel]
    bad_targets = [t for t in chan.targets if t not in TARGETS]
    if bad_targets:
        raise ConfigError(
            f"{where}: channel {channel} names unknown target(s) {', '.join(bad_targets)}",
            hint=f"targets: {', '.join(TARGETS)}",
        )
    if chan.order is not None and chan.order.after == channel:
        raise ConfigError(f"{where}: channel {channel} cannot come after itself")
    return chan


@contextmanager
def judging(store: Store, release: ReleaseTuple, channel: str, policy: InForce,
            actor: Actor | None, now: datetime | None) -> Iterator[GateContext]:
    """A gate context for one judgement, reading the policy in force (its files, for the
    gates that read them; its identities, for the gates that read signed evidence)."""
    chan = channel_policy(policy, channel)
    extra = {} if now is None else {"now": now}
    yield GateContext(store=store, release=release, channel=channel, policy=chan,
                      document=policy.document,
                      trust=RecordTrust.of(policy), actor=actor,
                      **extra)


def run_gates(ctx: GateContext, policy: InForce) -> GateReport:
    results = judge_signers(ctx, [CHECKS[name](ctx) for name in ctx.policy.gates], CHECKS)
    return GateReport(tuple_id=ctx.release.id, channel=ctx.channel, results=results,
                      policy_digest=policy.digest, policy_version=policy.version)
