"""Who acts on a store, as its policy lets that be said: the one resolution every front end
makes (``policy/actor.py`` decides; the store's ``identity:`` section says whether a typed
name may stand for the identity)."""

from __future__ import annotations

from k3artifacts.policy.actor import Actor, resolve_actor
from k3artifacts.policy.record import in_force
from k3artifacts.stores.records import RecordStore


def acting(store: RecordStore, typed: str | None = None) -> Actor:
    """The actor on ``store``: its identity source's answer, or ``typed`` (``--by``) where the
    store's policy allows a claimed name; refused (exit 9) otherwise."""
    return resolve_actor(store, typed=typed, identity=in_force(store).document.gates.identity)
