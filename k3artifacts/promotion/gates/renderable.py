"""``renderable``: the tuple renders for every serving target the channel names.

The real renderer runs (the same code as ``k3a render``), so a tuple that passes is one a
cluster can be given; a failure carries the renderer's own message and what to add (the FSx or
S3 location, the verifier image, a profile the target accepts). A tuple whose profile loads
with ``--load-format k3a`` only renders with the trust its pod checks signatures under, so the
gate renders it as ``k3a render --verify-signature`` would: with this client's pinned root and
the release identities in force.
"""

from __future__ import annotations

from k3artifacts.errors import K3AError
from k3artifacts.policy.results import GateResult
from k3artifacts.policy.signing_keys import verifier_trust
from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.serving.render import SIGNATURE_TARGETS, render
from k3artifacts.serving.render.common import loads_verified

NAME = "renderable"


def check(ctx: GateContext) -> GateResult:
    problems, rendered = [], []
    for target in ctx.policy.targets:
        try:
            verifier = (verifier_trust(ctx.store) if target in SIGNATURE_TARGETS
                        and loads_verified(ctx.release) else None)
            out = render(ctx.release, target, traffic=ctx.policy.traffic, verifier=verifier)
        except K3AError as exc:
            problems.append(f"{target}: {exc}" + (f" (next: {exc.hint})" if exc.hint else ""))
        else:
            rendered.append(f"{target} ({len(out.documents)} objects)")
    if problems:
        return GateResult(name=NAME, passed=False, reason="; ".join(problems))
    return GateResult(name=NAME, passed=True, reason="renders for " + ", ".join(rendered))
