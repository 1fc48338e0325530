"""What a record family's migrator is given and answers (``k3a trust migrate``, run by
:mod:`k3artifacts.migration`): one per family of records written before records were signed,
each registered in ``k3artifacts/migration/registry.py``.

A migrator plans first (what it would vouch for or re-sign, in words, and what it needs to do
it, read as found: nothing is written, nothing verified yet) and then acts on that plan, as
the identity migrating: a root identity of the store, whose root exists by then
(:class:`Migrating`), who signs what it vouches for (a history's base,
:func:`k3artifacts.migration.histories.based`; a record re-signed as its own). Running it again
on a migrated store plans nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from k3artifacts.policy.actor import Acting
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.pins import Roots


@dataclass(frozen=True)
class Migrating:
    """Who migrates: a root identity of the store (``acting.name`` is its name in the root),
    with the key it signs with, under the store's roots as this client trusts them."""

    acting: Acting
    roots: Roots


@dataclass(frozen=True)
class FamilyPlan:
    family: str
    #: What the act will do, in words, one line each; empty: nothing to migrate.
    steps: tuple[str, ...]
    #: What the act needs, as the plan found it (the family's own).
    found: Any = None


class Migrator(Protocol):
    #: The family's name, as ``k3a trust migrate`` reports it.
    family: str

    def plan(self, store: RecordStore) -> FamilyPlan: ...

    def act(self, store: RecordStore, who: Migrating, plan: FamilyPlan) -> None: ...
