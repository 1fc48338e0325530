"""Keys and identities for the trust tests: in-memory signers of each kind, and the policy's
identities section naming them."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from k3artifacts.trust.identities import Identities, Identity, KeyEntry
from k3artifacts.trust.keys import FileSigner, RecordSigner


def signer(kind: str = "ed25519") -> FileSigner:
    key = (ed25519.Ed25519PrivateKey.generate() if kind == "ed25519"
           else ec.generate_private_key({"ecdsa-p256": ec.SECP256R1(),
                                         "ecdsa-p384": ec.SECP384R1()}[kind]))
    return FileSigner(key, f"memory:{kind}")


def identities(**people: tuple[RecordSigner, list[str]]) -> Identities:
    """``name=(signer, roles)`` -> the identities section naming them."""
    return Identities(identities={
        name: Identity(roles=roles, keys=[KeyEntry.for_signer(s)])
        for name, (s, roles) in people.items()})
