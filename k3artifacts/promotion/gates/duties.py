"""``separation_of_duties``: whoever promotes did not review what the policy names.

The promoter and the reviewers are identities of the store's policy, each the one whose key
signed (the promoter's move, or the approver's signed answer; each review), so comparing them
means something: a review is read only through its signature (``releases/reviews.py``), and a
name typed in a record counts for nothing. In a flow the promoter is the approver of the
approval record, never a name typed in a form.
"""

from __future__ import annotations

from k3artifacts.policy.results import GateResult
from k3artifacts.promotion.gates.context import GateContext
from k3artifacts.releases.reviews import reviewers_of

NAME = "separation_of_duties"


def check(ctx: GateContext) -> GateResult:
    duties = ctx.policy.duties
    assert duties is not None  # ChannelPolicy refuses the gate without its settings
    if ctx.actor is None:
        # A dry run that names no promoter (a flow before its approval): the move itself
        # always has one and runs this gate again.
        return GateResult(
            name=NAME, passed=True, reason="not checked yet: the move checks its promoter"
        )
    reviewers = reviewers_of(ctx.store, ctx.release, ctx.manifest, trust=ctx.trust)
    who = ctx.actor.identities()
    clashes = [kind for kind in duties.not_reviewer_of if who & reviewers.get(kind, set())]
    if clashes:
        return GateResult(
            name=NAME,
            passed=False,
            reason=f"{ctx.actor.label()} reviewed the {' and '.join(clashes)} of {ctx.release.id}; "
            f"the policy of {ctx.channel} needs someone else to promote it",
        )
    named = sorted({r for kind in duties.not_reviewer_of for r in reviewers.get(kind, set())})
    return GateResult(
        name=NAME,
        passed=True,
        reason=f"promoter {ctx.actor.label()} ({ctx.actor.source}) is not a "
        f"{'/'.join(duties.not_reviewer_of)} reviewer"
        + (f" ({', '.join(named)})" if named else ""),
    )
