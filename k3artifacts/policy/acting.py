"""Who acts on a store: the identity whose key this process signs with, as the store's policy
in force names it. The one resolution every front end makes (``cli/``, ``flows/``), and what
every move and record writer takes.

::

    me = acting(store)               # refused by name when the key is no identity of the policy
    me.actor                         # the Actor records name (identity, key id)
    me.require("promote", "moving production")   # refused unless the identity holds the role
    data = me.sign(key=KEY, kind="review", body=review,   # the stored bytes, signed
                   store_id=store_id(store))             # for this store (policy/signed.py)
    data = me.cosign(data, key=KEY)  # one more signature (a second identity's assent)

The key is ``K3A_IDENTITY_KEY`` or this account's personal key, made on first use
(:func:`k3artifacts.trust.keys.identity_signer`); the identity is the one of the policy's
``identities.yaml`` that lists that key, with that identity's roles. Nothing else is asked:
no typed name, no environment variable naming a person, no cloud service (an S3 store's
STS answer is never consulted, so a store without STS, SeaweedFS or MinIO, works the same).

**First use.** On a store with no policy yet there is nobody to ask. The client that makes
its first move (or ``k3a policy init``) seeds it: its key becomes the store's root of trust
(:func:`k3artifacts.trust.enrol.first_use`, trust on first use, pinned in this client's
configuration) unless this client already pins a root for the store (a team's keys, ``k3a
trust init --root``), and the seeded policy names the root's identities with every role.
Until the seed is written :attr:`Acting.seeding` says what it will hold; resolving writes
nothing to the store (a move's plan never does).
"""

from __future__ import annotations

from k3artifacts.errors import ConfigError, MigrationNeeded, TrustRootError
from k3artifacts.policy.actor import Acting, Actor, Seeding, os_account
from k3artifacts.policy.record import in_force
from k3artifacts.stores.records import RecordStore
from k3artifacts.trust.identities import (
    IDENTITY_NAME,
    ROLES,
    SEEDED_ROLES,
    Identities,
    Identity,
    KeyEntry,
)
from k3artifacts.trust.keys import RecordSigner, identity_signer, signer_key_id
from k3artifacts.trust.pins import load_pin
from k3artifacts.trust.root import Root, first_root, root_key, walk_rotations

KEY_HINT = ("`k3a key show` prints your key and how a policy names it: hand its public half "
            "to one of the store's root identities, who proposes a policy change adding you "
            "(`k3a policy propose DIR` with you in identities.yaml, and the roles you need)")


class UnknownIdentity(ConfigError):
    """This process's key is no identity of the store's policy: it cannot act there."""

    hint = KEY_HINT


def acting(store: RecordStore) -> Acting:
    """The identity this process acts as on ``store``: its key (the personal key is made now
    if absent, and written at its first signature) matched against the policy in force.
    UnknownIdentity (exit 9) for a key the policy does not name; TrustRootError (exit 9) on a
    store with no policy yet whose root this client has not pinned, or does not belong to."""
    key = identity_signer(create=True, on_first_signature=True)
    made = key.signer.source if key.created else None
    return identify(store, key.signer, made_key=made)


def identify(store: RecordStore, signer: RecordSigner, *,
             made_key: str | None = None) -> Acting:
    """``signer`` as an identity of ``store``'s policy in force."""
    policy = in_force(store)
    if policy.version == 0:
        return _seeder(store, signer, made_key)
    if policy.legacy:  # a store older than signing (the version-0 seeder returned above)
        raise MigrationNeeded(f"{store.url} predates signed records ({policy.label()} is "
                              "unsigned): nobody acts on it until it is migrated")
    trusted = policy.document.identities.keyring().get(signer_key_id(signer))
    if trusted is None:
        named = ", ".join(policy.document.identities.identities) or "none"
        raise UnknownIdentity(
            f"your key {signer_key_id(signer)[:16]} ({signer.source}) is no identity of the "
            f"store's policy {policy.label()} (identities: {named}): it cannot act on "
            f"{store.url}")
    return Acting(Actor(name=trusted.identity, source="key", key_id=trusted.key_id), signer,
                  trusted.roles, made_key)


def seeded_identities(root: Root) -> Identities:
    """A first policy's identities: every root identity, with every role but ``release`` (a
    team narrows them, and adds people and release keys, by policy changes)."""
    return Identities(identities={name: Identity(roles=list(SEEDED_ROLES), keys=keys)
                                  for name, keys in root.identities.items()})


def _pinned_root(store: RecordStore) -> Root | None:
    pin = load_pin(store.url)
    if pin is None:
        return None
    return ([pin.root, *walk_rotations(store, pin.root)])[-1]


def rooted_as(store: RecordStore, signer: RecordSigner, *, only: str,
              hint: str) -> tuple[str, Root, bool]:
    """``signer`` as a root identity of ``store``: its name and the root in force as this
    client pins it (following rotations), and False; or, for a store with no root that this
    client pins none for, the name and root its first use would make, and True. Refuses
    (TrustRootError, exit 9) a root this client does not pin, or one that does not count this
    key (``only``: what only its identities do; ``hint``: the next step)."""
    root = _pinned_root(store)
    if root is not None:
        return root.require_identity(signer, only=only, hint=hint), root, False
    if store.read(root_key(1)) is not None:
        raise TrustRootError(
            f"{store.url} has a root of trust, which this client does not pin",
            hint="ask a root identity for its fingerprint (`k3a trust show`), then "
            "`k3a trust init --fingerprint FP`")
    name = os_account()
    if not IDENTITY_NAME.match(name):
        raise ConfigError(f"your account name {name!r} cannot name an identity",
                          hint="make the store's root first: `k3a trust init --name NAME`")
    return name, first_root({name: [KeyEntry.for_signer(signer)]}), True


def _seeder(store: RecordStore, signer: RecordSigner, made_key: str | None) -> Acting:
    name, root, first_use = rooted_as(
        store, signer, only=f"seed the policy of {store.url}, which has none yet",
        hint="ask one of them to run the first move or `k3a policy init`")
    actor = Actor(name=name, source="key", key_id=signer_key_id(signer))
    return Acting(actor, signer, frozenset(ROLES), made_key,
                  Seeding(root, first_use, seeded_identities(root)))
