"""Faults the local hub injects into its answers, configured while it runs, and the log of
every request it answered: test stand-ins, kept out of the wheel (``k3a demo`` needs neither).

:class:`FaultyHub` is a :class:`~k3artifacts.localhub.LocalHub` with both::

    hub = FaultyHub(tmp_path / "hub")
    hub.faults.add("*.safetensors", Fault.drop(after_bytes=4096))
    [r for r in hub.requests if r.target == "model.safetensors"]


A :class:`Fault` matches a request by a glob over the repo file path (``resolve`` requests) or
over the URL path (API requests, e.g. ``/api/models/*``), and acts on a number of matching
requests (``times``; ``None`` = every one). Each kind reproduces one way a real download breaks:

========== ==================================================================================
``drop``    close the connection after ``after_bytes`` body bytes
``status``  answer ``status`` (500/503/429...) with an optional ``Retry-After``
``stall``   sleep ``seconds`` before the headers, or after ``after_bytes`` body bytes
``trickle`` after ``after_bytes`` body bytes, send ``chunk`` bytes every ``seconds``
``short``   promise the full Content-Length, send ``missing`` bytes fewer, close
``corrupt`` flip the byte at file offset ``offset`` (the listing keeps the true sha256/size)
``json``    pass a JSON answer of the API (200 only) through ``edit`` (a malformed listing)
``next``    point a tree listing's ``Link: next`` at ``origin`` (another host)
``whole``   ignore ``Range`` and answer 200 with the whole body (a proxy that strips it)
``slow_headers`` send the status line and headers one byte every ``seconds``
``mutate``  change the bytes between attempts: with ``good_first`` attempt 1 serves the listed
            bytes and later attempts other bytes of the same size; without, the reverse
========== ==================================================================================

Faults on a file act where its bytes are served: on the CDN for an LFS file the hub redirects,
on the hub otherwise. ``at="resolve"`` aims one at the hub's redirecting answer instead.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from k3artifacts.localhub import LocalHub
from k3artifacts.localhub.server import BodyPlan, RequestRecord

FaultKind = Literal[
    "drop", "status", "stall", "trickle", "short", "corrupt", "mutate", "json", "next", "whole",
    "slow_headers",
]

#: XOR mask of the "other bytes" a mutate fault serves: every byte differs from the listed one.
MUTATE_MASK = 0x5A


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    times: int | None = 1
    after_bytes: int | None = None
    status: int = 503
    retry_after: int | None = None
    seconds: float = 0.0
    missing: int = 1
    offset: int = 0
    good_first: bool = True
    #: Which methods it hits. GET only by default, so a client's HEAD before the download
    #: neither trips nor uses up a body fault; add "HEAD" to break metadata calls too.
    methods: frozenset[str] = frozenset({"GET"})
    repo_id: str | None = None
    chunk: int = 1
    edit: Callable[[Any], Any] | None = None
    origin: str | None = None
    #: "file": where the bytes are served (the CDN for a redirected LFS file); "resolve": the
    #: hub's redirecting answer to ``/resolve/``.
    at: Literal["file", "resolve"] = "file"

    def __post_init__(self) -> None:
        if self.kind not in ("drop", "status", "stall", "trickle", "short", "corrupt", "mutate",
                             "json", "next", "whole", "slow_headers"):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.times is not None and self.times < 1:
            raise ValueError("Fault.times must be >= 1 or None (every matching request)")

    @classmethod
    def drop(cls, after_bytes: int, *, times: int | None = 1, **kw) -> Fault:
        return cls("drop", times=times, after_bytes=after_bytes, **kw)

    @classmethod
    def http_status(
        cls, status: int = 503, *, retry_after: int | None = None, times: int | None = 1, **kw
    ) -> Fault:
        return cls("status", times=times, status=status, retry_after=retry_after, **kw)

    @classmethod
    def stall(
        cls, seconds: float, *, after_bytes: int | None = None, times: int | None = 1, **kw
    ) -> Fault:
        return cls("stall", times=times, seconds=seconds, after_bytes=after_bytes, **kw)

    @classmethod
    def trickle(
        cls, chunk: int, seconds: float, *, after_bytes: int = 0, times: int | None = None, **kw
    ) -> Fault:
        return cls("trickle", times=times, chunk=chunk, seconds=seconds, after_bytes=after_bytes,
                   **kw)

    @classmethod
    def json(cls, edit: Callable[[Any], Any], *, times: int | None = None, **kw) -> Fault:
        return cls("json", times=times, edit=edit, **kw)

    @classmethod
    def next_page_on(cls, origin: str, *, times: int | None = None, **kw) -> Fault:
        return cls("next", times=times, origin=origin.rstrip("/"), **kw)

    @classmethod
    def short(cls, missing: int = 1, *, times: int | None = 1, **kw) -> Fault:
        return cls("short", times=times, missing=missing, **kw)

    @classmethod
    def corrupt(cls, offset: int = 0, *, times: int | None = None, **kw) -> Fault:
        return cls("corrupt", times=times, offset=offset, **kw)

    @classmethod
    def whole(cls, *, times: int | None = None, **kw) -> Fault:
        return cls("whole", times=times, **kw)

    @classmethod
    def slow_headers(cls, seconds: float, *, times: int | None = None, **kw) -> Fault:
        return cls("slow_headers", times=times, seconds=seconds, **kw)

    @classmethod
    def mutate(cls, *, good_first: bool = True, times: int | None = None, **kw) -> Fault:
        return cls("mutate", times=times, good_first=good_first, **kw)


@dataclass
class _Armed:
    pattern: str
    fault: Fault
    remaining: int | None
    attempts: int = 0


class FaultSet:
    """The armed faults of one hub. Thread-safe; each matching request uses up one ``times``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[_Armed] = []

    def add(self, path: str, fault: Fault) -> None:
        with self._lock:
            self._armed.append(_Armed(path, fault, fault.times))

    def clear(self) -> None:
        with self._lock:
            self._armed.clear()

    def plan(
        self, *, method: str, repo_id: str | None, target: str, stage: str = "file"
    ) -> BodyPlan:
        """Consume the faults matching this request and say how to answer it."""
        plan = BodyPlan()
        with self._lock:
            matched = [
                a
                for a in self._armed
                if (a.remaining is None or a.remaining > 0)
                and method in a.fault.methods
                and a.fault.at == stage
                and (a.fault.repo_id is None or a.fault.repo_id == repo_id)
                and (a.pattern == target or fnmatch.fnmatchcase(target, a.pattern))
            ]
            # A status answer replaces the body, so it alone is consumed by this request.
            status = next((a for a in matched if a.fault.kind == "status"), None)
            if status is not None:
                matched = [status]
            for a in matched:
                if a.remaining is not None:
                    a.remaining -= 1
                a.attempts += 1
                self._apply(a, plan)
        return plan

    @staticmethod
    def _apply(a: _Armed, plan: BodyPlan) -> None:
        f = a.fault
        if f.kind == "status":
            plan.status, plan.retry_after = f.status, f.retry_after
        elif f.kind == "drop":
            cut = f.after_bytes or 0
            plan.cut_at = cut if plan.cut_at is None else min(plan.cut_at, cut)
        elif f.kind == "stall":
            if f.after_bytes is None:
                plan.stall_before += f.seconds
            else:
                plan.stalls.append((f.after_bytes, f.seconds))
        elif f.kind == "trickle":
            plan.trickle = (f.after_bytes or 0, max(f.chunk, 1), f.seconds)
        elif f.kind == "json" and f.edit is not None:
            plan.json_edits.append(f.edit)
        elif f.kind == "next":
            plan.next_origin = f.origin
        elif f.kind == "short":
            plan.short_by = max(plan.short_by, f.missing)
        elif f.kind == "corrupt":
            plan.transforms.append(_flip_at(f.offset))
        elif f.kind == "whole":
            plan.whole = True
        elif f.kind == "slow_headers":
            plan.header_trickle = f.seconds
        elif f.kind == "mutate":
            first = a.attempts == 1
            if first != f.good_first:
                plan.transforms.append(_xor_all)


def _flip_at(offset: int) -> Callable[[int, bytearray], None]:
    def flip(start: int, buf: bytearray) -> None:
        if start <= offset < start + len(buf):
            buf[offset - start] ^= 0xFF

    return flip


_MUTATE_TABLE = bytes(b ^ MUTATE_MASK for b in range(256))


def _xor_all(start: int, buf: bytearray) -> None:
    del start
    buf[:] = buf.translate(_MUTATE_TABLE)


class FaultyHub(LocalHub):
    """A local hub that misbehaves as told (:attr:`faults`) and records every answer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults = FaultSet()
        self._requests: list[RequestRecord] = []
        self._req_lock = threading.Condition()
        self._in_flight = 0

    def plan_answer(self, *, method: str, repo_id: str | None, target: str,
                    stage: str) -> BodyPlan:
        return self.faults.plan(method=method, repo_id=repo_id, target=target, stage=stage)

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request answered so far, in completion order (a copy).

        A client can read the last byte of an answer before the server thread has recorded
        it, so this waits (briefly) for answers in progress to be recorded."""
        with self._req_lock:
            self._req_lock.wait_for(lambda: self._in_flight == 0, timeout=2.0)
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._req_lock:
            self._requests.clear()

    def begin_request(self) -> None:
        with self._req_lock:
            self._in_flight += 1

    def record(self, rec: RequestRecord) -> None:
        with self._req_lock:
            self._requests.append(rec)
            self._in_flight -= 1
            self._req_lock.notify_all()
