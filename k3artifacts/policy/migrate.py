"""The policy's migrator (``k3a trust migrate``, :mod:`.migrating`): a policy history written
before changes were signed (an unsigned pointer ``{"version", "digest", "change"}``, unsigned
changes) is vouched for, change by change, by a checkpoint the migrating root identity signs,
and the next version is signed into force (``action: migrate``), naming the root's identities
with every role where the policy named none, so that someone may act on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from k3artifacts.canonical import canonical_json
from k3artifacts.errors import AlreadyExists, UntrustedRecord
from k3artifacts.policy.acting import seeded_identities
from k3artifacts.policy.document import IDENTITIES_FILE
from k3artifacts.policy.migrating import FamilyPlan, Migrating
from k3artifacts.policy.record import (
    LAYOUT,
    POINTER_KEY,
    LegacyPointer,
    PolicyChange,
    change_key,
    legacy_head,
    read_document,
    renewed,
    store_document,
    unchecked_freshness,
    unsigned_pointer,
)
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.chain import append, vouch_legacy
from k3artifacts.trust.identities import identities_yaml


@dataclass(frozen=True)
class _Found:
    pointer: LegacyPointer
    #: The pointer's change, as stored there (logged as it is if its mover died first).
    head: dict


class PolicyMigrator:
    family = "policy"

    def plan(self, store: RecordStore) -> FamilyPlan:
        found = store.read(POINTER_KEY)
        if found is None or not unsigned_pointer(found.data):
            return FamilyPlan(self.family, ())
        version, head = legacy_head(found.data)
        pointer = LegacyPointer.model_validate_json(found.data)
        read_document(store, pointer.digest)  # a pointer to no document is not vouched for
        return FamilyPlan(self.family, (
            f"vouch for policy versions 1 to {version} (unsigned) with a checkpoint",
            f"sign version {version + 1} into force, naming the root's identities where the "
            "policy names none"), _Found(pointer, head))

    def act(self, store: RecordStore, who: Migrating, plan: FamilyPlan) -> None:
        if not plan.steps:
            return
        found: _Found = plan.found
        version = found.pointer.version
        try:  # the pointer's mover died before logging its change: log it as it is
            store.create(change_key(version), canonical_json(found.head))
        except AlreadyExists:
            pass
        entries = []
        for seq in range(1, version + 1):
            record = store.read(change_key(seq))
            if record is None:
                raise UntrustedRecord(change_key(seq), "gap", f"policy version {seq} was "
                                      "removed while it was migrated")
            entries.append(record.data)
        signer, name = who.acting.signer, who.acting.name
        vouch_legacy(store, LAYOUT, entries, signer=signer, identity=name,
                     store_id=who.roots.current.store_id)
        # Not yet fresh: this move signs the freshness head once the version is in force.
        current = unchecked_freshness(store)
        assert current.chain is not None
        document = current.document
        if not document.identities.identities:
            document = document.with_file(
                IDENTITIES_FILE, identities_yaml(seeded_identities(who.roots.current)))
        store_document(store, document)
        change = PolicyChange(
            version=version + 1, digest=document.digest, previous_digest=current.digest,
            action="migrate", by=who.acting.actor, at=datetime.now(UTC),
            why="signed into force by `k3a trust migrate`",
            root_version=who.roots.current.version)
        append(store, current.chain, change, signer=signer, identity=name)
        renewed(store, signer)


MIGRATOR = PolicyMigrator()
