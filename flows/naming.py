"""Flow run names and tags that tell runs apart in the Prefect runs list.

Names come from the parameters, through ``flow_run_name`` callables (Prefect calls them with
no arguments when the run starts; the parameters are in :mod:`prefect.runtime`). What only the
run learns (the commit a branch resolves to, the repo behind a tuple) is added once known by
:func:`label_run`, which renames and re-tags the current run. Tags are ``noun:value`` so the
runs list filters on them: ``repo:moonshotai/Kimi-K3``, ``commit:1e0e978...``,
``tuple:k3t-...``, ``channel:production``.
"""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.runtime import flow_run

#: Commits are shown (names) by this many hex digits; tags carry all 40.
SHORT = 7


def stage_name() -> str:
    p = flow_run.parameters
    return f"stage {p.get('repo_id', 'moonshotai/Kimi-K3')}@{short(p.get('revision', 'main'))}"


def promote_name() -> str:
    p = flow_run.parameters
    return f"promote {p['tuple_id']} -> {p.get('channel', 'staging')}"


def rollback_name() -> str:
    p = flow_run.parameters
    to = p.get("to")
    return f"rollback {p.get('channel', 'production')}" + (f" to {to}" if to else "")


def short(revision: str) -> str:
    """A commit cut to SHORT digits; a branch or tag name as it is."""
    is_commit = len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)
    return revision[:SHORT] if is_commit else revision


def tags(*, repo: str | None = None, commit: str | None = None, tuple_id: str | None = None,
         channel: str | None = None) -> list[str]:
    pairs = (("repo", repo), ("commit", commit), ("tuple", tuple_id), ("channel", channel))
    return [f"{noun}:{value}" for noun, value in pairs if value]


def label_run(new_tags: list[str], name: str | None = None) -> None:
    """Add ``new_tags`` to the current flow run (keeping its own) and rename it if ``name``."""
    ctx = FlowRunContext.get()
    if ctx is None:
        return
    run = ctx.flow_run
    merged = list(dict.fromkeys([*run.tags, *new_tags]))
    with get_client(sync_client=True) as client:
        client.update_flow_run(run.id, name=name, tags=merged)
    # The context's copy is what a later label_run call merges with.
    run.tags = merged
    if name:
        run.name = name
