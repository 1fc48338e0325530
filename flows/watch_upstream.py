"""Flow ``watch-upstream``: stage every new head of the watched branches, once.

Scheduled (hourly in prefect.yaml / ``python -m flows.serve``). Each pass resolves each branch
to its commit, drops the commits the store already has published, drops those a staging run is
already working on (a flow run tagged with the commit that is not finished), and starts
``stage-release`` for the rest: as a subflow in this process by default, or as a run of a
deployment (``deployment="stage-release/default"``) so that staging happens on the work pool
built for it. A pass over an unchanged upstream starts nothing.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    FlowRunFilterTags,
)
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment

from k3artifacts.errors import K3AError
from k3artifacts.reporting import events
from k3artifacts.revisions.refs import check_repo_id

from .common import slug, store_from
from .logs import quiet_task_completions
from .notify import notify
from .stage_release import DEFAULT_REPO, resolve_commit, stage_release

UNFINISHED = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.PAUSED,
              StateType.CANCELLING]


def commit_tag(repo_id: str, commit: str) -> str:
    """The tag every staging run started by the watcher carries, to find it again."""
    return slug("k3a-stage", repo_id, commit)


def _in_flight(tag: str) -> list[str]:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[tag]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=UNFINISHED)),
        ))
    return [r.name for r in runs]


@flow(name="watch-upstream", persist_result=False)
def watch_upstream(
    repo_id: str = DEFAULT_REPO,
    branches: list[str] | None = None,
    store_url: str | None = None,
    endpoint: str | None = None,
    deployment: str | None = None,
    stage_parameters: dict | None = None,
) -> list[dict]:
    """Start ``stage-release`` for each branch head (default: ``main``) not yet in the store.

    ``deployment``: run staging as that deployment (``flow-name/deployment-name``) instead
    of a subflow; the watcher then does not wait for it. ``stage_parameters``: extra
    parameters for stage-release (image, profile, quarantine, retries...).
    """
    quiet_task_completions()
    logger = get_run_logger()
    check_repo_id(repo_id)
    store = store_from(store_url)
    heads: dict[str, list[str]] = {}
    for branch in branches or ["main"]:
        heads.setdefault(resolve_commit(endpoint, repo_id, branch), []).append(branch)
    published = set(store.list_revisions(repo_id))
    actions: list[dict] = []
    failed: list[str] = []
    for commit, names in heads.items():
        action = {"commit": commit, "branches": names}
        if commit in published:
            actions.append(action | {"action": "already staged"})
            continue
        tag = commit_tag(repo_id, commit)
        running = _in_flight(tag)
        if running:
            logger.info(
                "%s@%s: staging already in progress (%s)", repo_id, commit, ", ".join(running)
            )
            actions.append(action | {"action": f"in progress: {', '.join(running)}"})
            continue
        params = (stage_parameters or {}) | {
            "repo_id": repo_id, "revision": commit, "store_url": store_url, "endpoint": endpoint,
        }
        logger.info("%s@%s (%s) is new: staging it", repo_id, commit, ", ".join(names))
        notify(events.upstream_revision_found(repo_id, names[0], commit))
        if deployment:
            run = run_deployment(deployment, parameters=params, tags=[tag, "k3a-watch"], timeout=0)
            actions.append(action | {"action": f"started deployment run {run.name}"})
            continue
        with tags(tag, "k3a-watch"):
            state = stage_release(**params, return_state=True)
        actions.append(action | {"action": f"staged: {state.type.value.lower()}"})
        if not state.is_completed():
            failed.append(f"{commit}: {state.message}")
    _report(repo_id, actions)
    if failed:
        raise K3AError("staging failed for " + "; ".join(failed),
                       hint="see the stage-release runs; the next pass (or a re-run) resumes them")
    return actions


def _report(repo_id: str, actions: list[dict]) -> None:
    lines = [f"# upstream {repo_id}", "", "| branches | commit | action |", "|---|---|---|"]
    lines += [f"| {', '.join(a['branches'])} | `{a['commit']}` | {a['action']} |" for a in actions]
    create_markdown_artifact("\n".join(lines), key=slug("k3a-watch", repo_id),
                             description="what the last pass of the upstream watcher did")
