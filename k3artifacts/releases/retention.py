"""``k3a revision gc``: retire published revisions no channel can reach, by a retention policy.

A revision is kept when any of these holds, else it is retired (deleted from the store):

* it is among the newest ``keep`` published revisions of its repo;
* it was published less than ``keep_days`` ago;
* a tuple bound to it is a channel's current pointer, or the tuple of one of the channel's
  newest ``rollback_window`` history entries (what a rollback reaches for).

Deleting runs the retirement protocol of :mod:`k3artifacts.releases.retirement` per revision
(tombstone, pins, a fresh look at every channel, then delete), so a promotion racing gc either
is refused or keeps the revision; no channel is left pointing at deleted weights. On S3 the
delete removes current versions; noncurrent ones expire by the bucket's lifecycle rule
(``k3a bootstrap --noncurrent-days``).

The move is :func:`plan_gc` (every verdict, by the store's policy; writes nothing: what ``k3a
revision gc`` prints without ``--apply``), then :func:`act_gc` (each retirement by the protocol;
the warm artifacts that live as long as a revision go with it, ``warm/retention.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import AlreadyExists
from k3artifacts.faultpoints import pause
from k3artifacts.policy.actor import Actor
from k3artifacts.policy.model import GatePolicy
from k3artifacts.policy.record import in_force
from k3artifacts.releases.channels import channel_names, read_state
from k3artifacts.releases.retirement import (
    Marker,
    live_pins,
    read_tombstone,
    tombstone_key,
)
from k3artifacts.releases.tuples import TupleStore
from k3artifacts.revisions.manifest import META_DIR, manifest_key, revision_prefix
from k3artifacts.stores.base import Store
from k3artifacts.stores.records import RecordStore
from k3artifacts.stores.revisions import RevisionStore

Revision = tuple[str, str]  # (repo_id, commit)


class RevisionVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    repo_id: str
    commit: str
    published_at: datetime
    bytes: int
    #: What retiring it gives back: bytes whose last link (file store) or last reference (S3)
    #: goes with it; a file shared with a kept revision is not counted. For a plan, what
    #: retiring it alone would free now (revisions sharing files free them with the last one).
    freed: int = 0
    action: Literal["keep", "retire", "retired", "kept"]
    #: Why kept (or, after --apply, why a planned retirement did not happen).
    reason: str


def reachable(store: RecordStore, policy: GatePolicy) -> dict[Revision, list[str]]:
    """Revisions a channel can reach -> how (``production current``, ``staging #7``)."""
    tuples = TupleStore(store)
    weights: dict[str, Revision] = {}
    found: dict[Revision, list[str]] = {}

    def add(tuple_id: str, how: str) -> None:
        if tuple_id not in weights:
            w = tuples.get(tuple_id).binding.weights
            weights[tuple_id] = (w.repo_id, w.commit)
        found.setdefault(weights[tuple_id], []).append(how)

    for channel in channel_names(store):
        state = read_state(store, channel)
        if state.pointer is None:
            continue
        add(state.pointer.tuple_id, f"{channel} current")
        chan = policy.channels.get(channel)
        window = (chan.rollback_window if chan else None) or policy.retention.rollback_window
        for i, entry in enumerate(state.newest_first()):
            if i >= window:
                break
            add(entry.tuple_id, f"{channel} #{entry.seq}")
    return found


def _published(store: RecordStore) -> list[tuple[str, str, datetime]]:
    suffix = f"/{META_DIR}/manifest.json"
    out = []
    for key in store.list_keys("models/"):
        if not key.endswith(suffix):
            continue
        parts = key[len("models/") : -len(suffix)].split("/")
        if len(parts) != 3:
            continue
        repo_id, commit = f"{parts[0]}/{parts[1]}", parts[2]
        when = store.modified_at(key)
        if when is not None:
            out.append((repo_id, commit, when))
    return out


def _size(store: RevisionStore, repo_id: str, commit: str) -> int:
    return sum(store.object_sizes(revision_prefix(repo_id, commit) + "/").values())


def plan(
    store: Store, policy: GatePolicy, *, keep: int, keep_days: float, now: datetime | None = None
) -> list[RevisionVerdict]:
    """What gc would do: every published revision, newest first per repo. Writes nothing."""
    now = now or datetime.now(UTC)
    reach = reachable(store, policy)
    by_repo: dict[str, list[tuple[str, datetime]]] = {}
    for repo_id, commit, when in _published(store):
        by_repo.setdefault(repo_id, []).append((commit, when))
    verdicts = []
    for repo_id in sorted(by_repo):
        ranked = sorted(by_repo[repo_id], key=lambda c: c[1], reverse=True)
        for rank, (commit, when) in enumerate(ranked):
            reasons = []
            if (repo_id, commit) in reach:
                reasons.append("reachable: " + ", ".join(reach[(repo_id, commit)]))
            if rank < keep:
                reasons.append(f"newest {keep} of {repo_id}")
            if now - when < timedelta(days=keep_days):
                reasons.append(f"younger than {keep_days:g} days")
            verdicts.append(
                RevisionVerdict(
                    repo_id=repo_id,
                    commit=commit,
                    published_at=when,
                    bytes=_size(store, repo_id, commit),
                    freed=0 if reasons else store.reclaimable_bytes(repo_id, commit),
                    action="keep" if reasons else "retire",
                    reason="; ".join(reasons),
                )
            )
    return verdicts


def _take_tombstone(store: RecordStore, repo_id: str, commit: str, who: str, now: datetime) -> str:
    """Create the tombstone; '' when ours, else why not (another gc holds a fresh one)."""
    marker = Marker(repo_id=repo_id, commit=commit, who=who, why="k3a gc", at=now)
    try:
        store.create(tombstone_key(repo_id, commit), canonical_json(marker))
    except AlreadyExists:
        other = read_tombstone(store, repo_id, commit)
        if other is not None and not other.stale(now):
            return f"another gc ({other.who}, since {other.at:%H:%M:%S}) is retiring it"
        # A crashed gc's tombstone: take it over; the checks below run afresh.
    return ""


def retire(
    store: Store,
    verdict: RevisionVerdict,
    policy: GatePolicy,
    *,
    who: str,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    also: Callable[[Store, str, str], object] | None = None,
) -> RevisionVerdict:
    """Delete one revision ``plan`` marked for retirement, by the retirement protocol.

    ``also(store, repo_id, commit)`` runs once the revision is deleted, before the tombstone
    goes: what lives exactly as long as the revision's tuples (their warm-start artifacts,
    ``k3artifacts.warm.retention.retire_warm``, which this layer does not import)."""
    repo_id, commit = verdict.repo_id, verdict.commit
    busy = _take_tombstone(store, repo_id, commit, who, now())
    if busy:
        return verdict.model_copy(update={"action": "kept", "reason": busy})
    stone = tombstone_key(repo_id, commit)
    # Pins before channels: see releases/retirement.py for why this order is the proof.
    pins = live_pins(store, repo_id, commit, now())
    if pins:
        store.delete(stone)
        movers = ", ".join(f"{p.who} ({p.why})" for p in pins)
        return verdict.model_copy(
            update={"action": "kept", "reason": f"being moved onto by {movers}"}
        )
    reach = reachable(store, policy).get((repo_id, commit))
    if reach:
        store.delete(stone)
        return verdict.model_copy(
            update={"action": "kept", "reason": "became reachable: " + ", ".join(reach)}
        )
    pause("gc-checked", commit)
    freed = 0
    if store.read(manifest_key(repo_id, commit)) is not None:
        freed = store.delete_revision(repo_id, commit)
    if also is not None:
        also(store, repo_id, commit)
    store.delete(stone)
    return verdict.model_copy(update={"action": "retired", "reason": "", "freed": freed})


class GcPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    policy: GatePolicy
    keep: int
    keep_days: float
    verdicts: list[RevisionVerdict]


def plan_gc(store: Store, *, keep: int | None = None, keep_days: float | None = None,
            now: datetime | None = None) -> GcPlan:
    """Every published revision's verdict by the retention section of the store's policy
    (``keep`` and ``keep_days`` override it). Writes nothing."""
    policy = in_force(store).document.gates
    keep = keep or policy.retention.keep
    keep_days = policy.retention.keep_days if keep_days is None else keep_days
    return GcPlan(policy=policy, keep=keep, keep_days=keep_days,
                  verdicts=plan(store, policy, keep=keep, keep_days=keep_days, now=now))


def act_gc(store: Store, gc_plan: GcPlan, *, by: Actor,
           also: Callable[[Store, str, str], object] | None = None) -> list[RevisionVerdict]:
    """Retire every revision the plan marks, each by the retirement protocol (it checks pins
    and channels afresh); ``also`` as in :func:`retire`."""
    return [retire(store, v, gc_plan.policy, who=by.name, also=also)
            if v.action == "retire" else v for v in gc_plan.verdicts]
