"""Which capture holds a warm artifact's key: the first, unless the channel would not use it.

A manifest is created once and a later capture for the same tuple, GPU and layout finds it
there. That first one stands only if the channel's rule (:func:`~.trust.warm_trust`: a record
signed by an identity the policy lets capture, and a release signature by a key the channel
trusts where the channel requires signatures) would use it. One that it would not use must not
squat the key for ever:

* a manifest no identity of the policy made (written by hand, signed by a key the policy does
  not trust for it, edited, malformed) is replaced by any capture;
* a capturer's record without the release signature the channel requires (or with one by a
  key it does not trust) is replaced by a capture signed by a key the channel trusts.

Replacing is compare-and-swap on the manifest and then on its release signature. Between the
two writes a reader finds the new manifest with the old (or no) signature: a named miss, never
a wrong use, and a capture Job that dies there is re-run and replaces it again.
"""

from __future__ import annotations

from dataclasses import replace

from k3artifacts.errors import AlreadyExists
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.signing.dsse import key_hint
from k3artifacts.signing.keys import ReleaseSigner
from k3artifacts.stores.base import Store
from k3artifacts.warm.model import WarmManifest, signature_key
from k3artifacts.warm.trust import NOBODY_MADE, WarmMiss, WarmTrust, check_manifest


class AlreadyCaptured(AlreadyExists):
    """The key already holds an artifact: one the channel would use (the first one stands),
    or one it would not, when this capture cannot replace it (no release signature, or one by
    a key the channel does not trust)."""

    def __init__(self, key: str, *, usable: bool, why: str | None = None):
        super().__init__(key)
        self.usable = usable
        if usable:
            self.hint = ("a warm artifact is created once; this one stands (re-run with "
                         "--if-absent to treat that as done)")
        else:
            self.args = (f"{key} already exists, and the channel would not use it ({why}); "
                         "only a capture signed by a key the channel trusts replaces it",)
            self.hint = "capture again with --signing-key KEY of a key the channel trusts"


def _unusable(store: Store, release: ReleaseTuple, *, gpu: str, tp: int, pp: int,
              trust: WarmTrust) -> WarmMiss | None:
    """Why the standing artifact for ``gpu`` and the layout would not be used; None: it
    would."""
    try:
        check_manifest(store, release, gpu=gpu, tp=tp, pp=pp,
                       trust=replace(trust, enabled=True))
    except WarmMiss as miss:
        return miss
    return None


def _may_replace(miss: WarmMiss, signer: ReleaseSigner | None, trust: WarmTrust | None) -> bool:
    if miss.reason in NOBODY_MADE:
        return True
    trusted = {key_hint(k) for k in trust.trusted.values()} if trust else set()
    return signer is not None and signer.key_hint in trusted


def check_claim(store: Store, release: ReleaseTuple, key: str, *, gpu: str, tp: int, pp: int,
                signer: ReleaseSigner | None, trust: WarmTrust | None) -> None:
    """Before anything is read or stored: AlreadyCaptured when an artifact stands at ``key``
    that the channel would use, or that this capture may not replace. :func:`publish` decides
    again at the write, for a capture that got there meanwhile."""
    if store.read(key) is None:
        return
    miss = None if trust is None else _unusable(store, release, gpu=gpu, tp=tp, pp=pp,
                                                trust=trust)
    if miss is None:
        raise AlreadyCaptured(key, usable=True)
    if not _may_replace(miss, signer, trust):
        raise AlreadyCaptured(key, usable=False, why=str(miss))


def publish(store: Store, release: ReleaseTuple, manifest: WarmManifest, record: bytes,
            signature: bytes | None, signer: ReleaseSigner | None,
            trust: WarmTrust | None) -> str | None:
    """Create the manifest's signed ``record`` (then its release signature, if any) at its
    key; returns why an artifact already there was replaced, None when the key was free.
    AlreadyCaptured when one stands; ``trust`` None: whatever is there stands."""
    key, sig_key = manifest.key, signature_key(manifest.key)
    try:
        store.create(key, record)
    except AlreadyExists:
        standing = store.read(key)
        miss = None if trust is None or standing is None else \
            _unusable(store, release, gpu=manifest.gpu, tp=manifest.tensor_parallel,
                      pp=manifest.pipeline_parallel, trust=trust)
        if miss is None:
            raise AlreadyCaptured(key, usable=True) from None
        if not _may_replace(miss, signer, trust):
            raise AlreadyCaptured(key, usable=False, why=str(miss)) from None
        assert standing is not None
        store.replace(key, record, standing.token)  # Conflict: another got there
        old = store.read(sig_key)
        if signature is not None:
            store.replace(sig_key, signature, old.token if old is not None else None)
        elif old is not None:
            # A release signature of the manifest replaced would only ever fail to verify.
            store.delete(sig_key)
        return str(miss)
    if signature is not None:
        store.create(sig_key, signature)
    return None
