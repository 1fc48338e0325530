"""What the flows share: names Prefect accepts, the store, and the task runner from config."""

from __future__ import annotations

import re

from prefect.task_runners import ThreadPoolTaskRunner

from k3artifacts.settings import default_store_url, default_workers, load
from k3artifacts.stores.base import Store
from k3artifacts.stores.registry import open_store


def store_from(url: str | None) -> Store:
    return open_store(url or default_store_url())


def slug(*parts: str) -> str:
    """A name Prefect accepts for artifact keys, tags and concurrency limits.

    Artifact keys allow only lowercase letters, digits and dashes, and concurrency-limit
    names refuse ``/``: ``moonshotai/Kimi-K3`` becomes ``moonshotai--kimi-k3``.
    """
    text = "-".join(p.replace("/", "--") for p in parts).lower()
    return re.sub(r"[^a-z0-9-]+", "-", text).strip("-")


def revision_slug(repo_id: str, commit: str) -> str:
    return slug(repo_id, commit)


def task_runner_from_env():
    """``DaskTaskRunner`` on ``$K3A_DASK_ADDRESS`` when set, else a thread pool of
    ``$K3A_WORKERS`` threads (default: ``k3a stage``'s, one per core from 2 to 8). Read when
    a flow module is imported, i.e. in the process that runs the flow (a Prefect worker's
    job), so each work pool can differ."""
    settings = load()
    address = settings.dask_address
    if address:
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(address=address)
    return ThreadPoolTaskRunner(max_workers=settings.workers or default_workers())
