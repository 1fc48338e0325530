"""Every record family ``k3a trust migrate`` migrates, in the order it runs them: the policy
first (the others are judged by it), its release keys last (a change that may wait for a
second root identity ends the run). A new family is one line here: its migrator
(:class:`k3artifacts.policy.migrating.Migrator`), beside the records it migrates."""

from __future__ import annotations

from k3artifacts.migration import channels, policy, release_keys
from k3artifacts.policy.migrating import Migrator
from k3artifacts.promotion import evidence_migration as evidence

MIGRATORS: tuple[Migrator, ...] = (
    policy.MIGRATOR,
    channels.MIGRATOR,
    evidence.MIGRATOR,
    release_keys.MIGRATOR,
)
