"""Who signed the evidence the evaluation, image_scan, infrastructure and traffic gates passed
on, judged against the channel's ``evidence`` policy (``policy/model.py:EvidencePolicy``):
so that one key (a CI service's, stolen) cannot carry every gate that reads evidence.

Each evidence gate that passed is asked again once per identity that may sign its kind, judging
only that identity's records (``GateContext.signer``): the identities it counts. Then

* ``signers``: a kind counts at least that many distinct identities;
* ``apart``: every identity is counted for the kinds of one group at most: some choice of
  identities per group meets every kind's number, no identity in two groups.

A gate whose evidence fails the rule fails, its reason naming who signed and which rule: the
history records it like any other gate's reason. A record read in the migration window (unsigned,
its maker a typed name) is counted for nobody here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from k3artifacts.policy.model import EVIDENCE_GATES, EvidencePolicy
from k3artifacts.policy.results import GateResult
from k3artifacts.policy.signed import KIND_ROLES
from k3artifacts.promotion.gates.context import GateContext

#: The record kind (``policy/signed.py``) each evidence kind is signed as.
RECORD_KINDS = {"evaluation": "evaluation", "scan": "scan", "preflight": "preflight",
                "traffic": "traffic-analysis"}

Check = Callable[[GateContext], GateResult]


def _may_sign(ctx: GateContext, kind: str) -> list[str]:
    roles = set(KIND_ROLES[RECORD_KINDS[kind]])
    return sorted({key.identity for key in ctx.trust.keyring if roles & key.roles})


def _counted(ctx: GateContext, kind: str, check: Check) -> set[str]:
    return {who for who in _may_sign(ctx, kind) if check(replace(ctx, signer=who)).passed}


def _groups_met(rule: EvidencePolicy, counted: Mapping[str, set[str]]) -> bool:
    """Whether the identities can be shared out among the ``apart`` groups, each to one group
    at most, so that every kind of a group counts its number among its group's share."""
    groups = [[kind for kind in group if kind in counted] for group in rule.apart]
    people = sorted(set().union(*(counted[k] for group in groups for k in group)))

    def met(share: list[set[str]]) -> bool:
        return all(len(counted[k] & share[g]) >= rule.signers.get(k, 1)
                   for g, group in enumerate(groups) for k in group)

    def choose(i: int, share: list[set[str]]) -> bool:
        if i == len(people):
            return met(share)
        who = people[i]
        return any(choose(i + 1, [s | {who} if n == g else s for n, s in enumerate(share)])
                   for g, group in enumerate(groups)
                   if any(who in counted[k] for k in group)) or choose(i + 1, share)

    return choose(0, [set() for _ in groups])


def _shown(names: set[str]) -> str:
    return ", ".join(sorted(names)) or "nobody"


def judge_signers(ctx: GateContext, results: list[GateResult],
                  checks: Mapping[str, Check]) -> list[GateResult]:
    """``results`` with each evidence gate that passed but whose signers the channel's
    ``evidence`` policy refuses turned into a failure that says why."""
    rule = ctx.policy.evidence
    if rule is None:
        return results
    passed = {r.name for r in results if r.passed}
    counted = {kind: _counted(ctx, kind, checks[EVIDENCE_GATES[kind]])
               for kind in rule.kinds() if EVIDENCE_GATES[kind] in passed}
    refused: dict[str, str] = {}
    for kind, who in counted.items():
        wanted = rule.signers.get(kind, 1)
        if len(who) < wanted:
            refused[kind] = (f"{kind} evidence passes as signed by {len(who)} identit"
                             f"{'y' if len(who) == 1 else 'ies'} ({_shown(who)}); the channel's "
                             f"evidence.signers asks {wanted} distinct identities")
    if not refused and rule.apart and not _groups_met(rule, counted):
        groups = " | ".join(", ".join(group) for group in rule.apart)
        for group in rule.apart:
            for kind in group:
                if kind in counted:
                    refused[kind] = (
                        f"{kind} evidence passes as signed by {_shown(counted[kind])} only, "
                        "who cannot also be counted for the other evidence they signed: the "
                        f"channel's evidence.apart keeps {groups} signed by different "
                        "identities")
    gates = {EVIDENCE_GATES[kind]: reason for kind, reason in refused.items()}
    return [GateResult(name=r.name, passed=False, reason=f"{gates[r.name]} ({r.reason})")
            if r.name in gates else r for r in results]
