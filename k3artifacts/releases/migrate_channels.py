"""The channels' migrator (``k3a trust migrate``, :mod:`k3artifacts.policy.migrating`): each
channel history written before moves were signed (a pointer copying its entry, unsigned
entries) is checked as every reader of such a store checks it (pointer against log), completed
from its pointer where its mover died before logging, and vouched for, entry by entry, by a
checkpoint the migrating root identity signs. Its pointer is then accepted as the last entry
vouched for, until the next move appends a signed one after it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import AlreadyExists, UntrustedRecord
from k3artifacts.policy.migrating import FamilyPlan, Migrating
from k3artifacts.releases.channels import (
    channel_names,
    layout,
    pointer_key,
    read_as_found,
    read_state,
)
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.chain import vouch_legacy
from k3artifacts.trust.envelope import is_unsigned
from k3artifacts.trust.pins import load_pin


@dataclass(frozen=True)
class _Unsigned:
    channel: str
    seq: int
    #: The pointer's entry, as stored there (logged as it is if its mover died first).
    head: dict


def _vouched(store: RecordStore, channel: str) -> bool:
    """Whether ``channel``'s unsigned history is vouched for already (migrated, not moved
    since): it verifies, checkpoint and all, under the root this client pins."""
    if load_pin(store.url) is None:
        return False
    try:
        read_state(store, channel)
    except UntrustedRecord:
        return False
    return True


class ChannelsMigrator:
    family = "channels"

    def plan(self, store: RecordStore) -> FamilyPlan:
        found = []
        for channel in channel_names(store):
            pointer = store.read(pointer_key(channel))
            if pointer is None or not is_unsigned(pointer.data, key=pointer_key(channel)) \
                    or _vouched(store, channel):
                continue
            state = read_as_found(store, channel, pointer)  # PointerMismatch: not vouched for
            found.append(_Unsigned(channel, len(state.entries),
                                   json.loads(pointer.data)["entry"]))
        return FamilyPlan(self.family, tuple(
            f"vouch for channel {u.channel}'s entries 1 to {u.seq} (unsigned) with a checkpoint"
            for u in found), tuple(found))

    def act(self, store: RecordStore, who: Migrating, plan: FamilyPlan) -> None:
        for unsigned in plan.found:
            where = layout(unsigned.channel)
            try:  # the pointer's mover died before logging its entry: log it as it is
                store.create(where.entry_key(unsigned.seq), canonical_json(unsigned.head))
            except AlreadyExists:
                pass
            entries = []
            for seq in range(1, unsigned.seq + 1):
                record = store.read(where.entry_key(seq))
                if record is None:
                    raise UntrustedRecord(where.entry_key(seq), "gap", f"entry #{seq} of "
                                          f"{where.name} was removed while it was migrated")
                entries.append(record.data)
            vouch_legacy(store, where, entries, signer=who.acting.signer,
                         identity=who.acting.name, store_id=who.roots.current.store_id)


MIGRATOR = ChannelsMigrator()
