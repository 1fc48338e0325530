"""Runners: how the staging engine's per-file jobs are executed.

A runner takes the run's jobs and yields each job with its outcome or the exception it raised,
in completion order. The engine decides what a failure means; the runner only decides where
jobs run and stops starting new ones when :meth:`Runner.stop` is called. ``k3a stage`` uses
:class:`ThreadRunner`; the ``stage-release`` flow has a runner that submits Prefect tasks
(threads, or Dask/Kubernetes workers through Prefect's task runners).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Protocol

from k3artifacts.staging.worker import FileJob, FileOutcome, run_file_job

Outcome = FileOutcome | BaseException


class Runner(Protocol):
    def run(self, jobs: list[FileJob]) -> Iterator[tuple[FileJob, Outcome]]:
        """Run every job (largest first is the caller's order); yield as each finishes."""
        ...

    def stop(self) -> None:
        """Start no job not yet started; those running finish (their partial files stay
        resumable)."""
        ...


class ThreadRunner:
    """Jobs in a thread pool of this process."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        self._futures: list[Future] = []

    def run(self, jobs: list[FileJob]) -> Iterator[tuple[FileJob, Outcome]]:
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="k3a-fetch")
        try:
            futures = {pool.submit(run_file_job, job): job for job in jobs}
            self._futures = list(futures)
            for fut in as_completed(futures):
                if fut.cancelled():
                    continue
                exc = fut.exception()
                yield futures[fut], (fut.result() if exc is None else exc)
        finally:
            # Left early (Ctrl-C, an error in the caller): files not started never start, the
            # running ones finish so that their partial files stay resumable.
            pool.shutdown(wait=True, cancel_futures=True)

    def stop(self) -> None:
        for fut in self._futures:
            fut.cancel()
