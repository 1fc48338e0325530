"""Signed in-toto statements about one record: its name, the sha256 of its bytes, and a
predicate saying what it binds. Used for release tuples (``releases/signatures.py``)."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.signing.dsse import STATEMENT_TYPE, BundleError, Verified, verify_bundle


def statement(
    name: str, sha256: str, predicate_type: str, predicate: dict[str, Any]
) -> dict[str, Any]:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": sha256}}],
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def verify_statement(
    bundle: bytes,
    trusted: dict[str, ec.EllipticCurvePublicKey],
    *,
    name: str,
    sha256: str,
    predicate_type: str,
    predicate: dict[str, Any],
) -> Verified:
    """Check the signature, then that it speaks of exactly these bytes and this predicate."""
    verified = verify_bundle(bundle, trusted)
    signed = verified.statement
    if signed.get("predicateType") != predicate_type:
        raise BundleError(f"signed predicate {signed.get('predicateType')!r}, not {predicate_type}")
    subjects = signed.get("subject") or []
    if subjects != [{"name": name, "digest": {"sha256": sha256}}]:
        got = [(s.get("name"), (s.get("digest") or {}).get("sha256")) for s in subjects]
        raise BundleError(f"the signature is over {got}, not {name} with sha256 {sha256}")
    if signed.get("predicate") != predicate:
        keys = sorted(
            k for k in set(predicate) | set(signed.get("predicate") or {})
            if predicate.get(k) != (signed.get("predicate") or {}).get(k)
        )
        raise BundleError(f"the signed binding differs from the record in {keys}")
    return verified
