"""The policy's migrator (``k3a trust migrate``, :mod:`k3artifacts.policy.migrating`): a policy
history written before changes were signed (an unsigned pointer ``{"version", "digest",
"change"}``, unsigned changes) is signed as found by the migrating root identity into the
history's base (each change marked ``migrated_under``, :mod:`.histories`), which its pointer
then holds, and the next version is signed into force
(``action: migrate``), naming the root's identities with every role where the policy named
none, so that someone may act on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError

from k3artifacts.canonical import to_plain
from k3artifacts.errors import UntrustedRecord
from k3artifacts.migration.histories import based
from k3artifacts.policy.acting import seeded_identities
from k3artifacts.policy.document import IDENTITIES_FILE
from k3artifacts.policy.migrating import FamilyPlan, Migrating
from k3artifacts.policy.record import (
    LAYOUT,
    POINTER_KEY,
    LegacyPointer,
    PolicyChange,
    change_key,
    read_document,
    renewed,
    store_document,
    unchecked_freshness,
    unsigned_pointer,
)
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.chain import append
from k3artifacts.trust.identities import identities_yaml


@dataclass(frozen=True)
class _Found:
    #: The pointer's version token: the pointer moves to the base from exactly it.
    token: str | None
    #: Every change, 1 to the pointer's, as found.
    changes: tuple[PolicyChange, ...]


def _change(data: bytes, key: str) -> PolicyChange:
    try:
        return PolicyChange.model_validate_json(data)
    except ValidationError as exc:
        raise UntrustedRecord(key, "malformed", f"not a policy change: "
                              f"{exc.errors()[0]['msg']}") from None


def _as_found(store: RecordStore, data: bytes) -> list[PolicyChange]:
    """Changes 1 to the pointer's, the pointer's own where its mover died before logging it;
    a log that says otherwise than the pointer is not re-signed."""
    try:
        pointer = LegacyPointer.model_validate_json(data)
    except ValidationError as exc:
        raise UntrustedRecord(POINTER_KEY, "malformed", "not a pointer older than signing: "
                              f"{exc.errors()[0]['msg']}") from None
    read_document(store, pointer.digest)  # a pointer to no document is not re-signed
    out = []
    for version in range(1, pointer.version + 1):
        key = change_key(version)
        logged = store.read(key)
        change = None if logged is None else _change(logged.data, key)
        if version == pointer.version:
            if change is not None and change != pointer.change:
                raise UntrustedRecord(key, "fork", f"policy version {version} in the log is not "
                                      "the change its pointer holds")
            change = pointer.change
        if change is None:
            raise UntrustedRecord(key, "gap", f"policy version {version} is missing (the "
                                  f"pointer names version {pointer.version})")
        out.append(change)
    return out


def _stored(store: RecordStore, key: str | None) -> bytes | None:
    found = None if key is None else store.read(key)
    return None if found is None else found.data


class PolicyMigrator:
    family = "policy"

    def plan(self, store: RecordStore) -> FamilyPlan:
        found = store.read(POINTER_KEY)
        if found is None:
            return FamilyPlan(self.family, ())
        if unsigned_pointer(found.data):
            changes = _as_found(store, found.data)
            resigning = (f"re-sign policy versions 1 to {len(changes)} (unsigned) as found",)
        elif found.data == _stored(store, LAYOUT.base_key):
            changes, resigning = [], ()  # a run that died before the next version
        else:
            return FamilyPlan(self.family, ())
        return FamilyPlan(self.family, (*resigning, (
            "sign the next version into force, naming the root's identities where the policy "
            "names none")), _Found(found.token, tuple(changes)))

    def act(self, store: RecordStore, who: Migrating, plan: FamilyPlan) -> None:
        if not plan.steps:
            return
        found: _Found = plan.found
        signer, name = who.acting.signer, who.acting.name
        under = who.roots.current.version
        if found.changes:
            based(store, LAYOUT, [{**to_plain(c), "migrated_under": under}
                                  for c in found.changes], found.token, signer=signer,
                  identity=name, store_id=who.roots.current.store_id)
        # Not yet fresh: this move signs the freshness head once the version is in force.
        current = unchecked_freshness(store)
        assert current.chain is not None
        document = current.document
        if not document.identities.identities:
            document = document.with_file(
                IDENTITIES_FILE, identities_yaml(seeded_identities(who.roots.current)))
        store_document(store, document)
        change = PolicyChange(
            version=current.version + 1, digest=document.digest,
            previous_digest=current.digest, action="migrate", by=who.acting.actor,
            at=datetime.now(UTC), why="signed into force by `k3a trust migrate`",
            root_version=under)
        append(store, current.chain, change, signer=signer, identity=name)
        renewed(store, signer)


MIGRATOR = PolicyMigrator()
