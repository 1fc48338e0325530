"""Prefect 3 flows over the k3artifacts library: staging, watching upstream, promote, rollback.

The library imports no Prefect; everything Prefect-specific (tasks, retries, artifacts,
concurrency limits, pauses for approval, task runners) lives here.
"""

from .logs import quiet_task_completions

quiet_task_completions()
