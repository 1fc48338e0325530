"""Retiring a revision while promotions run: tombstones (gc) and pins (moves).

A revision is deleted by ``k3a revision gc`` only when no channel can reach it; a promotion makes a
channel reach it. Without care the two race: gc decides the revision is unreferenced, a
promotion that already checked the weights swaps a pointer onto it, gc deletes, and production
points at nothing. The two sides each write their own marker first and then read the other's
(the store is strongly consistent, so at least one of them sees the other)::

    gc                                        promote / rollback onto a tuple of R
    1. create tombstone  T(R)                 0. plan: gates, checks (nothing written)
    2. read pins of R    -> any: give up      1. create pin  P(R)
    3. read channels     -> R reachable:      2. read T(R)  -> present: refuse (nothing moved)
       give up                                3. check the manifest is there
    4. delete R (manifest first)              4. compare-and-swap the pointer
    5. delete T(R)                            5. delete P(R)

If promote's step 2 saw no tombstone, gc's step 1 came after it, so gc's step 2 (after its
step 1) sees the pin or, once the pin is gone, gc's step 3 (after its step 2) sees the pointer
that was swapped before the pin was removed. gc reads pins *before* channels for that reason.
A pin or tombstone left by a crashed process expires after :data:`STALE_AFTER`: a move takes
seconds, and a gc run that finds its own stale tombstone takes it over.

Keys::

    releases/retirement/tombstones/<org>/<name>/<commit>.json
    releases/retirement/pins/<org>/<name>/<commit>/<uuid>.json
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, ValidationError

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import Conflict
from k3artifacts.faultpoints import pause
from k3artifacts.stores.records import RecordStore

RETIREMENT_PREFIX = "releases/retirement/"
#: Older pins and tombstones are leftovers of a crashed process.
STALE_AFTER = timedelta(hours=1)


class Marker(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    repo_id: str
    commit: str
    who: str
    why: str
    at: datetime

    def stale(self, now: datetime) -> bool:
        return now - self.at > STALE_AFTER


class RevisionRetiring(Conflict):
    """The revision is being deleted by gc: moving a channel onto it is refused."""


def tombstone_key(repo_id: str, commit: str) -> str:
    return f"{RETIREMENT_PREFIX}tombstones/{repo_id}/{commit}.json"


def pins_prefix(repo_id: str, commit: str) -> str:
    return f"{RETIREMENT_PREFIX}pins/{repo_id}/{commit}/"


def _parse(data: bytes | None) -> Marker | None:
    if data is None:
        return None
    try:
        return Marker.model_validate_json(data)
    except ValidationError:
        # Unreadable: treat as present and fresh (the safe reading for both sides).
        return Marker(repo_id="?", commit="?", who="?", why="unreadable", at=datetime.now(UTC))


def read_tombstone(store: RecordStore, repo_id: str, commit: str) -> Marker | None:
    found = store.read(tombstone_key(repo_id, commit))
    return _parse(None if found is None else found.data)


def live_pins(store: RecordStore, repo_id: str, commit: str, now: datetime) -> list[Marker]:
    pins = []
    for key in store.list_keys(pins_prefix(repo_id, commit)):
        found = store.read(key)
        marker = _parse(None if found is None else found.data)
        if marker is not None and not marker.stale(now):
            pins.append(marker)
    return pins


def check_not_retiring(store: RecordStore, repo_id: str, commit: str) -> None:
    """Refuse (RevisionRetiring) a move onto a revision gc is retiring. A move's plan asks
    before it writes anything; only the ask under its pin (step 2) is the protocol's."""
    stone = read_tombstone(store, repo_id, commit)
    if stone is not None:
        raise RevisionRetiring(
            f"{repo_id}@{commit} is being retired by {stone.who} ({stone.why}, since "
            f"{stone.at:%Y-%m-%d %H:%M} UTC); no channel may move onto it",
            hint="promote another tuple; if the gc that wrote it crashed, "
            "`k3a revision gc --apply` takes over a tombstone older than "
            f"{STALE_AFTER.total_seconds() / 3600:.0f} h "
            f"({tombstone_key(repo_id, commit)}) and finishes or withdraws it",
        )


@contextlib.contextmanager
def pinned(store: RecordStore, repo_id: str, commit: str, *, who: str, why: str) -> Iterator[None]:
    """Hold a pin on a revision while a move onto it runs; refuse if gc is retiring it."""
    key = f"{pins_prefix(repo_id, commit)}{uuid.uuid4().hex}.json"
    store.create(key, canonical_json(
        Marker(repo_id=repo_id, commit=commit, who=who, why=why, at=datetime.now(UTC))))
    try:
        check_not_retiring(store, repo_id, commit)
        pause("move-pinned", commit)
        yield
    finally:
        store.delete(key)
