"""Changing the root: a rotation proposed by one root identity, co-signed by others until the
root in force's threshold of them signed it, then published create-once at
``releases/trust/root/<version>.json``, where every client verifies it under the root it pins
(:func:`k3artifacts.trust.pins.follow`).

While it lacks signatures a rotation waits at ``releases/trust/proposals/root-<version>.json``
(replaceable: nothing trusts a proposal). A co-signer names the fingerprint the proposer showed
them, so what they sign is what they were shown, whatever the store holds meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3artifacts.errors import AlreadyExists, ConfigError, Conflict, NotFound, UntrustedRecord
from k3artifacts.trust.envelope import add_signature
from k3artifacts.trust.identities import KeyEntry
from k3artifacts.trust.keys import RecordSigner
from k3artifacts.trust.pins import Pin, follow
from k3artifacts.trust.root import (
    Root,
    next_root,
    proposal_key,
    root_key,
    sign_root,
    verify_root_rotation,
)
from k3artifacts.trust.storage import RecordStore
from k3artifacts.trust.storeid import vouch_earlier


@dataclass(frozen=True)
class Rotation:
    root: Root
    #: Root identities (of the root in force) that signed it so far.
    signers: frozenset[str]
    needs: int
    #: Where it is now: its place in the root chain once published, else the proposal's.
    key: str
    published: bool
    #: This client's pin after it (moved to the new root once published).
    pin: Pin


def _signing_identity(root: Root, signer: RecordSigner) -> str:
    return root.require_identity(signer, only="sign its rotation", hint="ask one of them to run it")


def _settle(store: RecordStore, pin: Pin, data: bytes, token: str | None,
            signer: RecordSigner, identity: str) -> Rotation:
    """Publish ``data`` if it carries the threshold, else leave it as the proposal. The
    rotation that gives the store its id is published after ``identity`` vouched for the
    records signed before it (:func:`~k3artifacts.trust.storeid.vouch_earlier`)."""
    current = pin.root
    proposed, signers = verify_root_rotation(current, data, complete=False)
    version = proposed.version
    if len(signers) < current.threshold:
        store.replace(proposal_key(version), data, token)
        return Rotation(proposed, signers, current.threshold, proposal_key(version), False, pin)
    if current.store_id is None:
        vouch_earlier(store, current, proposed, signer, identity)
    try:
        store.create(root_key(version), data)
    except AlreadyExists:
        raise Conflict(f"root v{version} of {store.url} was published by someone else first; "
                       "nothing was written",
                       hint="`k3a trust show` follows it; propose again against it") from None
    moved, _ = follow(store, pin)
    return Rotation(proposed, signers, current.threshold, root_key(version), True, moved)


def rotate(store: RecordStore, pin: Pin, signer: RecordSigner, *,
           add: dict[str, list[KeyEntry]], remove: list[str],
           threshold: int | None) -> Rotation:
    """Propose the next root (``pin``'s, followed), signed by ``signer``; published at once
    when that one signature is the root's threshold."""
    current = pin.root
    me = _signing_identity(current, signer)
    unknown = sorted(set(remove) - set(current.identities))
    if unknown:
        raise ConfigError(f"not identities of root v{current.version}: {', '.join(unknown)}")
    proposed = next_root(current, add=add, remove=remove, threshold=threshold)
    waiting = store.read(proposal_key(proposed.version))
    return _settle(store, pin, sign_root(proposed, signer, me),
                   None if waiting is None else waiting.token, signer, me)


def cosign(store: RecordStore, pin: Pin, signer: RecordSigner, fingerprint: str) -> Rotation:
    """Add ``signer``'s signature to the proposed rotation, if it is the one ``fingerprint``
    names; published when that completes the threshold."""
    current = pin.root
    me = _signing_identity(current, signer)
    key = proposal_key(current.version + 1)
    found = store.read(key)
    if found is None:
        raise NotFound(f"no proposed root v{current.version + 1} in {store.url}",
                       hint="its proposer runs `k3a trust rotate --add/--remove ...` first")
    proposed, _ = verify_root_rotation(current, found.data, complete=False)
    if proposed.fingerprint != fingerprint:
        raise UntrustedRecord(key, "root-mismatch",
                              f"the proposal's fingerprint is {proposed.fingerprint}, not "
                              f"{fingerprint}: it is not the one you were shown",
                              hint="compare it with the proposer again; sign nothing else")
    return _settle(store, pin, add_signature(found.data, key=root_key(proposed.version),
                                             signer=signer), found.token, signer, me)
