"""Waiting on a condition with a deadline: the one way tests synchronise with something that
happens elsewhere (a thread, a subprocess, a server), instead of a fixed sleep that is too
short on a loaded machine and too long everywhere else."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from k3artifacts.stores.records import RecordStore

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 30.0,
               interval: float = 0.05, proc: subprocess.Popen | None = None) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail naming
    ``what`` once ``timeout`` seconds pass, or as soon as ``proc`` (the process expected to
    bring the condition about) has exited without it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited with {proc.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def until_a_later_second(store: RecordStore, prefix: str = "models/",
                         suffix: str = "manifest.json") -> None:
    """Return once a write now would be stamped later than every ``suffix`` key under
    ``prefix``: S3's LastModified has whole seconds, and gc ranks revisions by it, so a
    revision published within the same second as another does not count as newer."""
    stamps = [store.modified_at(k) for k in store.list_keys(prefix) if k.endswith(suffix)]
    newest = max((s for s in stamps if s is not None), default=None)
    if newest is None:
        return
    wait_until(lambda: datetime.now(UTC).replace(microsecond=0) > newest,
               f"a whole second later than {newest:%H:%M:%S.%f}", timeout=5)
