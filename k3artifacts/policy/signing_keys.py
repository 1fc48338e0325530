"""The release keys the store's signed policy in force trusts, for every reader of release
signatures but the promotion gate (which reads the document it judges by): `k3a verify
--signature`, and the pod's verifier that `k3a render --verify-signature` sets up. A local
directory (``--policies``, ``K3A_POLICIES``, ``./policies``) never supplies them: a key there
is no key the store's root signed into force.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from k3artifacts.errors import ConfigError
from k3artifacts.policy.record import InForce, in_force
from k3artifacts.policy.release_keys import ReleaseKeys
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust import pins
from k3artifacts.trust.heads import Heads, load_heads
from k3artifacts.trust.heads import config_map_files as heads_config_map_files
from k3artifacts.trust.pins import Pin
from k3artifacts.trust.root import Root


def _signed(store: RecordStore) -> InForce:
    policy = in_force(store)
    if policy.roots is None:
        raise ConfigError(f"{store.url} has no policy signed into force, so no release key "
                          "is trusted there",
                          hint="its first move (or `k3a policy init`) seeds one; a store older "
                          "than signing is migrated first (`k3a trust migrate`)")
    return policy


def release_keys(store: RecordStore) -> ReleaseKeys:
    """The release identities and channel rules of the store's policy in force, its history
    verified."""
    policy = _signed(store)
    return policy.document.release_keys()


@dataclass(frozen=True)
class VerifierTrust:
    """What a pod's verifier is given: the store's root as this client trusts it, to pin for
    the store the pod mounts, and the release identities and channel rules in force, as a
    ConfigMap file (the pod reads the keys it checks with from the store's policy, verified
    under that root; the copy shows what was trusted when it was rendered)."""

    root: Root
    pinned_at: datetime
    signing: dict[str, str]
    #: The heads this client verified of the store's histories when it rendered: the pod
    #: refuses a store set back behind what its render saw.
    heads: Heads

    def pin_for(self, store_url: str) -> dict[str, str]:
        """A pin of :attr:`root` for ``store_url``, and the heads its render saw, as ConfigMap
        data (two files), to mount at ``$XDG_CONFIG_HOME/k3artifacts/trust/``."""
        return {**pins.config_map_files(
            Pin(store=store_url, how="init", pinned_at=self.pinned_at, root=self.root)),
            **heads_config_map_files(store_url, self.heads)}


def verifier_trust(store: RecordStore) -> VerifierTrust:
    policy = _signed(store)
    assert policy.roots is not None
    signing = policy.document.release_keys().config_map_files()
    return VerifierTrust(policy.roots.current, policy.roots.pin.pinned_at, signing,
                         load_heads(store.url))
