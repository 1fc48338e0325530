"""How a client comes to pin a store's root: first use, a team's keys, or a fingerprint.

* **First use** (:func:`first_use`): a store that has no root yet, met by the client that
  seeds its first policy (``k3a policy init``, or the first move, which seeds the packaged
  defaults). There is no one to ask, so, as ssh's known_hosts trusts a host on first contact,
  this client's identity key becomes root v1 (one identity, threshold one): pinned here, and
  published in the store create-once (``releases/trust/root/0000000001.json``) for others to
  pin by its fingerprint. A store that already has a root is never taken over this way.
* **A team's keys** (:func:`pin_keys`, ``k3a trust init --root ... --root ...``): pinned by
  every member (and image) before or after first use; a team that does not want one person to
  hold the root even for a minute does this before the store is first used. It is published
  in the store when the pinning client is one of its identities and the store has none.
* **A fingerprint** (:func:`join`, ``k3a trust init --fingerprint FP``): the root the store
  holds, pinned only if its fingerprint is the one a root identity gave you out of band.

In every case, rotations the store holds after that root are verified and followed, and a
client that already pins another root for the store is refused before anything is written.
"""

from __future__ import annotations

from k3artifacts.errors import AlreadyExists, NotFound, TrustRootError, UntrustedRecord
from k3artifacts.trust.identities import KeyEntry
from k3artifacts.trust.keys import RecordSigner, signer_key_id
from k3artifacts.trust.pins import Pin, check_pinnable, load_pin, pin_root
from k3artifacts.trust.root import (
    Root,
    first_root,
    root_key,
    sign_root,
    stored_root,
    verify_first_root,
)
from k3artifacts.trust.storage import RecordReader, RecordStore


def _refuse_another_root(store: RecordReader, root: Root) -> None:
    key = root_key(1)
    found = store.read(key)
    if found is not None and stored_root(found.data, key).fingerprint != root.fingerprint:
        raise TrustRootError(
            f"{store.url} already has a root of trust (v1 at {key}), not {root.fingerprint[:16]}",
            hint="join it: ask a root identity for its fingerprint (`k3a trust show`), then "
            "`k3a trust init --fingerprint FP`")


def _refuse_another_id(store: RecordReader, root: Root) -> None:
    """The store's root v1 is this team's but for the store id (drawn by another member's
    pin): say so, rather than only that the roots differ."""
    key = root_key(1)
    found = store.read(key)
    if found is None:
        return
    stored = stored_root(found.data, key)
    if stored.store_id != root.store_id and (stored.identities, stored.threshold) == (
            root.identities, root.threshold):
        raise UntrustedRecord(
            key, "root-mismatch", f"the store's root v1 names these keys with store id "
            f"{stored.store_id}; this pin drew {root.store_id}",
            hint="pin the store's root by its fingerprint, compared with a root identity's "
            "`k3a trust show` (`k3a trust init --fingerprint FP`), or pin the keys with the "
            "store id your team drew (`--store-id ID`)")


def publish_first_root(store: RecordStore, root: Root, signer: RecordSigner,
                       identity: str) -> None:
    """Store ``root`` as the store's root v1 (create-once), unless it holds this same root;
    refuses when it holds another one."""
    try:
        store.create(root_key(1), sign_root(root, signer, identity))
    except AlreadyExists:
        _refuse_another_root(store, root)


def first_use(store: RecordStore, signer: RecordSigner, name: str,
              root: Root | None = None) -> tuple[Pin, bool]:
    """Make ``signer`` (as identity ``name``) the root of a store that has none; pin it.
    ``root``: that root as a plan made it already (its store id is drawn once). A client
    that already pins a root for the store keeps its store id: first use again is the same
    root, and pins nothing new."""
    if root is None:
        root = first_root({name: [KeyEntry.for_signer(signer)]})
        existing = load_pin(store.url)
        if existing is not None:
            root = Root.model_validate({**root.model_dump(), "store_id": existing.root.store_id})
    _refuse_another_root(store, root)
    check_pinnable(store, root)
    publish_first_root(store, root, signer, name)
    return pin_root(store, root, "first-use")


def pin_keys(store: RecordStore, root: Root, signer: RecordSigner | None) -> tuple[Pin, bool]:
    """Pin a team's root; publish it as root v1 where ``signer`` is one of its identities and
    the store (existing) has no root yet."""
    _refuse_another_id(store, root)
    check_pinnable(store, root)
    trusted = None if signer is None else root.keyring().get(signer_key_id(signer))
    if signer is not None and trusted is not None and store.read(root_key(1)) is None:
        publish_first_root(store, root, signer, trusted.identity)
    return pin_root(store, root, "init")


def join(store: RecordReader, fingerprint: str) -> tuple[Pin, bool]:
    """Pin the root v1 the store holds, if its fingerprint is ``fingerprint``."""
    found = store.read(root_key(1))
    if found is None:
        raise NotFound(f"{store.url} holds no root of trust (no {root_key(1)})",
                       hint="its root identities pinned it with --root: pin their keys the same "
                       "way (`k3a trust init --root NAME=KEY.pub.pem ...`)")
    return pin_root(store, verify_first_root(found.data, fingerprint), "fingerprint")
