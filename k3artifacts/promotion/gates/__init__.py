"""Promotion gates: what a tuple must satisfy to move onto a channel, each with its reason.

Which gates apply to which channel is data (``policies/promotion-gates.yaml``); the names and
checks are in :mod:`.registry`, one module per gate. Every gate takes one :class:`GateContext`
(store, tuple, channel, the channel's policy, the policies directory, the promoter, the time,
the manifest read lazily once) and returns a ``GateResult``.
"""

from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.promotion.gates.registry import (
    GATE_TABLE_HEADER,
    GATES,
    Gate,
    GateReport,
    Verdict,
    apply_overrides,
    channel_policy,
    check_gates,
    check_overrides,
    context,
    gate_rows,
    run_gates,
)

__all__ = [
    "GATE_TABLE_HEADER",
    "GATES",
    "Gate",
    "GateContext",
    "GateReport",
    "Verdict",
    "apply_overrides",
    "channel_policy",
    "check_gates",
    "check_overrides",
    "context",
    "gate_rows",
    "run_gates",
]
