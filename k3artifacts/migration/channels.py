"""The channels' migrator (``k3a trust migrate``, :mod:`k3artifacts.policy.migrating`): each
channel history written before moves were signed (a pointer copying its entry, unsigned
entries) is checked as every reader of such a store checks it (pointer against log), and its
entries as found, the one its mover died before logging included, are signed by the migrating
root identity into the history's base (each marked ``migrated_under``, :mod:`.histories`),
which its pointer then holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3artifacts.canonical import to_plain
from k3artifacts.migration.histories import based
from k3artifacts.policy.migrating import FamilyPlan, Migrating
from k3artifacts.releases.channels import (
    HistoryEntry,
    channel_names,
    layout,
    pointer_key,
    read_as_found,
)
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.envelope import is_unsigned


@dataclass(frozen=True)
class _Unsigned:
    channel: str
    #: The pointer's version token: the pointer moves to the base from exactly it.
    token: str | None
    entries: tuple[HistoryEntry, ...]


class ChannelsMigrator:
    family = "channels"

    def plan(self, store: RecordStore) -> FamilyPlan:
        found = []
        for channel in channel_names(store):
            pointer = store.read(pointer_key(channel))
            if pointer is None or not is_unsigned(pointer.data, key=pointer_key(channel)):
                continue
            state = read_as_found(store, channel, pointer)  # PointerMismatch: not re-signed
            found.append(_Unsigned(channel, pointer.token, state.entries))
        return FamilyPlan(self.family, tuple(
            f"re-sign channel {u.channel}'s entries 1 to {len(u.entries)} (unsigned) as found"
            for u in found), tuple(found))

    def act(self, store: RecordStore, who: Migrating, plan: FamilyPlan) -> None:
        under = who.roots.current.version
        for unsigned in plan.found:
            based(store, layout(unsigned.channel),
                  [{**to_plain(e), "migrated_under": under} for e in unsigned.entries],
                  unsigned.token, signer=who.acting.signer, identity=who.acting.name,
                  store_id=who.roots.current.store_id)


MIGRATOR = ChannelsMigrator()
