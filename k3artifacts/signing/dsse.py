"""Sigstore bundles of DSSE-wrapped in-toto statements, made and checked with a public key.

The byte format is the one the OpenSSF model-signing tools write for key-based signatures
(``model_signing sign key``): a sigstore bundle v0.3 whose ``verificationMaterial.publicKey``
carries only a *hint* (sha256 of the signer's PEM public key) and whose ``dsseEnvelope`` holds
the statement and one ECDSA signature over its DSSE pre-authentication encoding. Made here with
``cryptography`` alone, so signing and checking need neither the model-signing package nor a
network; the upstream ``model_signing verify key`` accepts what this writes (tests/test_signing).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"

#: Curves sigstore's key specs allow for ECDSA, with the digest each one signs with.
CURVE_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "secp256r1": hashes.SHA256,
    "secp384r1": hashes.SHA384,
    "secp521r1": hashes.SHA512,
}


class BundleError(ValueError):
    """A bundle that is malformed, signed by an unknown key, or over other bytes."""


def pae(payload: bytes, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """DSSE v1 pre-authentication encoding: what is actually signed."""
    return b"DSSEv1 %d %s %d %s" % (
        len(payload_type),
        payload_type.encode(),
        len(payload),
        payload,
    )


def key_hint(public_key: ec.EllipticCurvePublicKey) -> str:
    """sha256 hex of the PEM SubjectPublicKeyInfo: how a bundle names its key."""
    pem = public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(pem).hexdigest()


def _hash_for(key: ec.EllipticCurvePublicKey) -> hashes.HashAlgorithm:
    return CURVE_HASHES[key.curve.name]()


class KeySigner(Protocol):
    """Any key k3a signs with (:func:`k3artifacts.trust.keys.load_signer`): its public half,
    where it is (for messages), and a signature over bytes (ed25519's, or ECDSA's in DER over
    the curve's digest)."""

    public_key: Any
    source: str

    def sign(self, message: bytes) -> bytes: ...


def sign_statement(signer: KeySigner, statement: dict[str, Any]) -> bytes:
    """A bundle (JSON bytes) holding ``statement`` signed by ``signer``'s ECDSA key (a key in
    memory, KMS or a token: it is given the DSSE encoding and answers a DER signature)."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    signature = signer.sign(pae(payload))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {
            "publicKey": {"hint": key_hint(signer.public_key)},
            "tlogEntries": [],
        },
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(signature).decode(), "keyid": ""}],
        },
    }
    return json.dumps(bundle, indent=2, sort_keys=True).encode() + b"\n"


@dataclass(frozen=True)
class Verified:
    statement: dict[str, Any]
    #: Name of the trusted key that made the signature.
    key_name: str
    key_hint: str


def verify_bundle(data: bytes, trusted: dict[str, ec.EllipticCurvePublicKey]) -> Verified:
    """Check ``data`` was signed by one of ``trusted`` (name -> key); return its statement.

    Raises :class:`BundleError` saying why not: malformed, signed by a key not in
    ``trusted``, or a signature that does not match the payload it carries.
    """
    try:
        bundle = json.loads(data)
        if bundle.get("mediaType") != BUNDLE_MEDIA_TYPE:
            raise BundleError(f"media type {bundle.get('mediaType')!r}, not {BUNDLE_MEDIA_TYPE}")
        envelope = bundle["dsseEnvelope"]
        payload = base64.b64decode(envelope["payload"], validate=True)
        payload_type = envelope["payloadType"]
        signatures = [base64.b64decode(s["sig"], validate=True) for s in envelope["signatures"]]
        hint = (bundle["verificationMaterial"].get("publicKey") or {}).get("hint")
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        if isinstance(exc, BundleError):
            raise
        raise BundleError(f"not a sigstore bundle: {type(exc).__name__}: {exc}") from None
    if payload_type != PAYLOAD_TYPE:
        raise BundleError(f"payload type {payload_type!r}, not {PAYLOAD_TYPE}")
    if len(signatures) != 1:
        raise BundleError(f"{len(signatures)} signatures; expected exactly one")
    if not hint:
        raise BundleError("the bundle names no public key (certificate or keyless bundle?)")
    by_hint = {key_hint(key): (name, key) for name, key in trusted.items()}
    if hint not in by_hint:
        raise BundleError(f"signed by an untrusted key (hint {hint[:16]}...)")
    name, key = by_hint[hint]
    try:
        key.verify(signatures[0], pae(payload, payload_type), ec.ECDSA(_hash_for(key)))
    except InvalidSignature:
        raise BundleError(
            f"the signature by key {name!r} does not match the statement it carries"
        ) from None
    try:
        statement = json.loads(payload)
    except ValueError as exc:
        raise BundleError(f"the signed payload is not JSON: {exc}") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise BundleError(f"the signed payload is not an in-toto {STATEMENT_TYPE} statement")
    return Verified(statement, name, hint)
