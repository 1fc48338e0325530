"""One-box setup: serve the five flows from this process, the watcher and the freshness
refresh on cron schedules.

    python -m flows.serve --store s3://bucket/k3a --cron "7 * * * *"

Needs a Prefect API (``prefect server start`` beside it, or PREFECT_API_URL). Runs are
executed here, in subprocesses of this one; for a cluster use prefect.yaml and a work pool.
Promote and rollback are then started from the UI or ``prefect deployment run
promote/default -p tuple_id=... -p channel=production``.
"""

from __future__ import annotations

import argparse

from prefect import serve

from .promote import promote_release
from .refresh import refresh_freshness
from .rollback import rollback_channel
from .stage_release import DEFAULT_REPO, stage_release
from .watch_upstream import watch_upstream

HOURLY = "7 * * * *"
#: Well inside the packaged policy's freshness lifetime (168 h): a few missed runs are fine.
DAILY = "17 3 * * *"


def deployments(*, repo_id: str = DEFAULT_REPO, branches: list[str] | None = None,
                store_url: str | None = None, cron: str = HOURLY) -> list:
    common = {"store_url": store_url}
    return [
        watch_upstream.to_deployment(
            name="hourly", cron=cron, tags=["k3a", "step:watch", f"repo:{repo_id}"],
            parameters=common | {"repo_id": repo_id, "branches": branches or ["main"]},
        ),
        # Same tags as flows/prefect.yaml; names and noun tags come from the flows.
        stage_release.to_deployment(name="default", parameters=common,
                                    tags=["k3a", "step:stage"]),
        promote_release.to_deployment(name="default", parameters=common,
                                      tags=["k3a", "step:promote"]),
        rollback_channel.to_deployment(name="default", parameters=common,
                                       tags=["k3a", "step:rollback"]),
        refresh_freshness.to_deployment(name="daily", cron=DAILY, parameters=common,
                                        tags=["k3a", "step:refresh"]),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=DEFAULT_REPO, help="Hub repo to watch")
    parser.add_argument(
        "--branch", action="append", help="branch to watch (repeatable; default main)"
    )
    parser.add_argument("--store", help="store URL (default: $K3A_STORE or the local default)")
    parser.add_argument("--cron", default=HOURLY, help=f"watcher schedule (default {HOURLY!r})")
    args = parser.parse_args(argv)
    serve(
        *deployments(repo_id=args.repo, branches=args.branch, store_url=args.store, cron=args.cron)
    )


if __name__ == "__main__":
    main()
