"""Which capture holds a warm artifact's key: the first, unless the channel would not use it.

A manifest is created once and a later capture for the same tuple, GPU and layout finds it
there. That first one stands only if the channel's rule (:func:`~.trust.warm_trust`: signed by a
trusted key where the channel requires signatures) would use it. One that it would not use (an
unsigned capture taken first, a signature by a key the channel does not trust, a malformed
manifest) must not squat the key for ever: a capture signed by a key the channel trusts
replaces it, compare-and-swap on the manifest and then on its signature. Between the two
writes a reader finds the new manifest with the old (or no) signature: a named miss, never a
wrong use, and a capture Job that dies there is re-run and replaces it again.
"""

from __future__ import annotations

from dataclasses import replace

from k3artifacts.errors import AlreadyExists
from k3artifacts.releases.tuples import ReleaseTuple
from k3artifacts.signing.dsse import key_hint
from k3artifacts.signing.keys import Signer
from k3artifacts.stores.base import Store
from k3artifacts.warm.model import WarmManifest, signature_key
from k3artifacts.warm.trust import WarmMiss, WarmTrust, check_manifest


class AlreadyCaptured(AlreadyExists):
    """The key already holds an artifact: one the channel would use (the first one stands),
    or one it would not, when this capture cannot replace it (unsigned, or signed by a key the
    channel does not trust)."""

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
              trust: WarmTrust) -> str | None:
    """Why the standing artifact for ``gpu`` and the layout would not be used; None: it
    would."""
    try:
        check_manifest(store, release, gpu=gpu, tp=tp, pp=pp,
                       trust=replace(trust, enabled=True))
    except WarmMiss as miss:
        return f"{miss.reason}: {miss.detail}"
    return None


def _may_replace(signer: Signer | None, trust: WarmTrust | None) -> bool:
    trusted = {key_hint(k) for k in trust.trusted.values()} if trust else set()
    return signer is not None and signer.key_hint in trusted


def check_claim(store: Store, release: ReleaseTuple, key: str, *, gpu: str, tp: int, pp: int,
                signer: Signer | None, trust: WarmTrust | None) -> None:
    """Before anything is read or stored: AlreadyCaptured when an artifact stands at ``key``
    that the channel would use, or that this capture may not replace. :func:`publish` decides
    again at the write, for a capture that got there meanwhile."""
    if store.read(key) is None:
        return
    why = None if trust is None else _unusable(store, release, gpu=gpu, tp=tp, pp=pp,
                                               trust=trust)
    if why is None:
        raise AlreadyCaptured(key, usable=True)
    if not _may_replace(signer, trust):
        raise AlreadyCaptured(key, usable=False, why=why)


def publish(store: Store, release: ReleaseTuple, manifest: WarmManifest,
            signature: bytes | None, signer: Signer | None,
            trust: WarmTrust | None) -> str | None:
    """Create the manifest (then its signature) at its key; returns why an artifact already
    there was replaced, None when the key was free. AlreadyCaptured when one stands;
    ``trust`` None: whatever is there stands."""
    key, sig_key = manifest.key, signature_key(manifest.key)
    try:
        store.create(key, manifest.to_bytes())
    except AlreadyExists:
        standing = store.read(key)
        why = None if trust is None or standing is None else \
            _unusable(store, release, gpu=manifest.gpu, tp=manifest.tensor_parallel,
                      pp=manifest.pipeline_parallel, trust=trust)
        if why is None:
            raise AlreadyCaptured(key, usable=True) from None
        if not _may_replace(signer, trust):
            raise AlreadyCaptured(key, usable=False, why=why) from None
        assert standing is not None
        store.replace(key, manifest.to_bytes(), standing.token)  # Conflict: another got there
        assert signature is not None
        old = store.read(sig_key)
        store.replace(sig_key, signature, old.token if old is not None else None)
        return why
    if signature is not None:
        store.create(sig_key, signature)
    return None
