"""Run logs a person reads: without a "Finished in state Completed()" line per task.

A staging run has a task per file (thousands for a 1.56 TB release); each one's completion
line buries the lines that matter (resolved commit, verified files, the closing summary).
Failed, crashed and retried tasks still log theirs. Each flow installs the filter when it
starts, and the per-file task too (a Dask worker is another process), rather than importing
``flows`` reconfiguring logging for whoever imports it.
"""

from __future__ import annotations

import logging

_QUIET = "Finished in state Completed("


class _TaskCompletions(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and str(record.msg).startswith(_QUIET))


def quiet_task_completions() -> None:
    """Drop successful tasks' completion lines (idempotent: the filter is added once)."""
    logger = logging.getLogger("prefect.task_runs")
    if not any(isinstance(f, _TaskCompletions) for f in logger.filters):
        logger.addFilter(_TaskCompletions())
