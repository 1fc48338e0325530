"""Re-signing the evidence a store holds from before k3a signed records, planned, then acted:
what ``k3a trust migrate`` does for the evidence families (reviews, evaluations, image scans,
preflights, traffic analyses, single-node rollback records, warm manifests).

Until then such a record is read only while the store's policy says so
(``unsigned.read_evidence_before``); everywhere else it is refused by name as
``unsigned``. Re-signing keeps each record's body exactly as it was, wrapped so that it says so
(``policy/signed.py``), signed by the identity that migrates, who needs the role of each kind
it re-signs and vouches for what it signs: the record counts for that identity from then on
(the name the unsigned record typed stays in its body, for people). Approval requests and
decisions are not migrated: each lives for one move, and an old one is asked for again.

The plan lists every unsigned record and checks each parses as its family's model (one that
does not is listed as refused, never vouched for) and the role of each kind found; it writes
nothing. The act re-signs each, compare-and-swap over the unsigned object (Conflict, exit 6,
for one changed meanwhile: run it again). Running it again finds nothing left to do.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pydantic import BaseModel

from k3artifacts.errors import UntrustedRecord
from k3artifacts.policy.actor import Acting
from k3artifacts.policy.migrating import FamilyPlan, Migrating
from k3artifacts.policy.record import ensure_seeded
from k3artifacts.policy.signed import Family, require_role, resign_unsigned, unsigned_record
from k3artifacts.promotion.single_node import SINGLE_NODE
from k3artifacts.releases.analyses import ANALYSES
from k3artifacts.releases.evaluations import EVALUATIONS
from k3artifacts.releases.preflights import PREFLIGHTS
from k3artifacts.releases.reviews import REVIEWS
from k3artifacts.releases.scans import SCANS
from k3artifacts.stores.records import RecordStore
from k3artifacts.warm.trust import WARM_MANIFESTS

#: Every family of evidence, where it is stored and as what.
FAMILIES: tuple[Family[BaseModel], ...] = (  # type: ignore[assignment]
    REVIEWS, EVALUATIONS, SCANS, PREFLIGHTS, ANALYSES, SINGLE_NODE, WARM_MANIFESTS)


@dataclass(frozen=True)
class Unsigned:
    key: str
    family: Family[BaseModel]


@dataclass(frozen=True)
class EvidenceMigrationPlan:
    by: Acting | None
    #: The records to re-sign.
    unsigned: tuple[Unsigned, ...]
    #: Unsigned records that are not their family's model: (key, why). Never vouched for;
    #: restore them from a backup or remove them.
    refused: tuple[tuple[str, str], ...]
    #: Records signed already (left as they are; their readers verify them).
    signed: int
    when: datetime


@dataclass
class EvidenceMigration:
    """What the migration did: re-signed records by kind, and what it left."""

    resigned: dict[str, int] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    signed_already: int = 0
    by: str = ""


def plan_evidence_migration(store: RecordStore, *, by: Acting | None,
                            now: datetime | None = None) -> EvidenceMigrationPlan:
    """Every unsigned evidence record of ``store``; RoleRefused (exit 9) unless ``by`` may
    sign every kind found (``by`` None: ``k3a trust migrate``'s plan, made before who
    migrates is known; its act checks)."""
    unsigned, refused, signed = [], [], 0
    for family in FAMILIES:
        for key in store.list_keys(family.prefix):
            found = store.read(key) if key.endswith(".json") else None
            if found is None:
                continue
            try:
                record = unsigned_record(found.data, key=key, family=family)
            except UntrustedRecord as exc:
                refused.append((key, exc.detail))
                continue
            if record is None:
                signed += 1
            else:
                unsigned.append(Unsigned(key, family))
    plan = EvidenceMigrationPlan(by, tuple(unsigned), tuple(refused), signed,
                                 now or datetime.now(UTC))
    if by is not None:
        _require_roles(plan, by)
    return plan


def _require_roles(plan: EvidenceMigrationPlan, by: Acting) -> None:
    for kind in sorted({u.family.kind for u in plan.unsigned}):
        require_role(by, kind, f"re-signing {kind} records")


def act_evidence_migration(store: RecordStore,
                           plan: EvidenceMigrationPlan) -> EvidenceMigration:
    assert plan.by is not None, "who re-signs is known by the act"
    done = EvidenceMigration(refused=list(plan.refused), signed_already=plan.signed,
                             by=plan.by.name)
    if plan.by.seeding is not None and plan.unsigned:
        ensure_seeded(store, acting=plan.by)  # a store with no policy yet: the one that reads
    kinds: Counter[str] = Counter()
    for item in plan.unsigned:
        if resign_unsigned(store, item.key, item.family, by=plan.by, now=plan.when):
            kinds[item.family.kind] += 1
            done.keys.append(item.key)
    done.resigned = dict(kinds)
    return done


def migrate_evidence(store: RecordStore, acting: Acting) -> EvidenceMigration:
    """The evidence half of ``k3a trust migrate``: :func:`plan_evidence_migration`, then
    :func:`act_evidence_migration`."""
    return act_evidence_migration(store, plan_evidence_migration(store, by=acting))


class EvidenceMigrator:
    """The evidence family of ``k3a trust migrate`` (``migration/registry.py``): the records
    it would re-sign, then re-signed as the migrating identity, which must hold each kind's
    role. Records that are not their family's model are named and left."""

    family = "evidence"

    def plan(self, store: RecordStore) -> FamilyPlan:
        found = plan_evidence_migration(store, by=None)
        kinds = Counter(u.family.kind for u in found.unsigned)
        steps = [f"re-sign {n} unsigned {kind} record(s)" for kind, n in sorted(kinds.items())]
        steps += [f"leave {key}: {why}" for key, why in found.refused]
        return FamilyPlan(self.family, tuple(steps), found if found.unsigned else None)

    def act(self, store: RecordStore, who: Migrating, plan: FamilyPlan) -> None:
        if plan.found is None:
            return
        found = replace(plan.found, by=who.acting)
        _require_roles(found, who.acting)
        act_evidence_migration(store, found)


MIGRATOR = EvidenceMigrator()
