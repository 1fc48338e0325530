"""The migrate move: planned (who migrates, under which root, and what each family would
vouch for; nothing written), then acted (the root made on first use if the store has none,
then each family in turn, as that root identity).

Who migrates is a root identity of the store, as this client pins it; a store with no root of
trust at all (older than signing) gets one from the migrating client's key, as its first move
would (trust on first use, :func:`k3artifacts.trust.enrol.first_use`), but only when there is
something to migrate.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3artifacts.migration.registry import MIGRATORS
from k3artifacts.policy.acting import rooted_as
from k3artifacts.policy.actor import Acting, Actor
from k3artifacts.policy.migrating import FamilyPlan, Migrating
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust import enrol
from k3artifacts.trust.identities import ROLES
from k3artifacts.trust.keys import RecordSigner, identity_signer, signer_key_id
from k3artifacts.trust.pins import trusted_roots
from k3artifacts.trust.root import Root


@dataclass(frozen=True)
class MigrationPlan:
    signer: RecordSigner
    #: The root identity migrating, as the root names it.
    identity: str
    #: The root this migration makes (the store has none); None: the store's, as pinned here.
    first_root: Root | None
    families: tuple[FamilyPlan, ...]
    #: Where this plan made the personal key (the front end says so), else None.
    made_key: str | None = None

    @property
    def empty(self) -> bool:
        return not any(f.steps for f in self.families)


def plan_migration(store: RecordStore) -> MigrationPlan:
    """Who migrates and what: TrustRootError (exit 9) for a store whose root this client
    does not pin, or whose root does not count this key (:func:`~k3artifacts.policy.acting.
    rooted_as`); UntrustedRecord or PointerMismatch (exit 4) for a history that does not hold
    together as found (never vouched for)."""
    key = identity_signer(create=True)
    signer = key.signer
    made = signer.source if key.created else None
    name, root, first_use = rooted_as(store, signer,
                                      only="vouch for a history older than signing",
                                      hint="ask one of them to run `k3a trust migrate`")
    first = root if first_use else None
    families = tuple(migrator.plan(store) for migrator in MIGRATORS)
    return MigrationPlan(signer, name, first, families, made)


def act_migration(store: RecordStore, plan: MigrationPlan) -> None:
    if plan.empty:
        return
    if plan.first_root is not None:
        enrol.first_use(store, plan.signer, plan.identity, plan.first_root)
    acting = Acting(Actor(name=plan.identity, source="key", key_id=signer_key_id(plan.signer)),
                    plan.signer, frozenset(ROLES))
    who = Migrating(acting, trusted_roots(store))
    for migrator, family in zip(MIGRATORS, plan.families, strict=True):
        migrator.act(store, who, family)


def migrate(store: RecordStore) -> MigrationPlan:
    """The migrate move: :func:`plan_migration`, then :func:`act_migration`."""
    plan = plan_migration(store)
    act_migration(store, plan)
    return plan
