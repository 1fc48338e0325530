"""``renderable``: the tuple renders for every serving target the channel names.

The real renderer runs (the same code as ``k3a render``), so a tuple that passes is one a
cluster can be given; a failure carries the renderer's own message and what to add (the FSx or
S3 location, the verifier image, a profile the target accepts).
"""

from __future__ import annotations

from k3artifacts.errors import K3AError
from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.serving.render import render

NAME = "renderable"


def check(ctx: GateContext) -> GateResult:
    problems, rendered = [], []
    for target in ctx.policy.targets:
        try:
            out = render(ctx.release, target, traffic=ctx.policy.traffic)
        except K3AError as exc:
            problems.append(f"{target}: {exc}" + (f" (next: {exc.hint})" if exc.hint else ""))
        else:
            rendered.append(f"{target} ({len(out.documents)} objects)")
    if problems:
        return GateResult(name=NAME, passed=False, reason="; ".join(problems))
    return GateResult(name=NAME, passed=True, reason="renders for " + ", ".join(rendered))
