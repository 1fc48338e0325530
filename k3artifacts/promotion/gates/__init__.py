"""Promotion gates' checks: what a tuple must satisfy to move onto a channel, each with its
reason.

Which gates apply to which channel is the store's policy (:mod:`k3artifacts.policy`); the
checks are bound to names in :mod:`.registry`, one module per gate. Every gate takes one
:class:`GateContext` (store, tuple, channel, the channel's policy, the policy's files, the
promoter, the time, the manifest read lazily once) and returns a ``GateResult``.
"""

from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.promotion.gates.registry import (
    CHECKS,
    channel_policy,
    judging,
    run_gates,
)

__all__ = [
    "CHECKS",
    "GateContext",
    "channel_policy",
    "judging",
    "run_gates",
]
