"""Signing keys: where a signature comes from.

``--signing-key`` (or ``K3A_SIGNING_KEY``) names one of:

* a PEM private key file, ECDSA on P-256 or P-384 (``openssl ecparam -name prime256v1
  -genkey -noout -out release.pem``); a passphrase, if any, comes from
  ``K3A_SIGNING_KEY_PASSWORD``;
* a ``pkcs11:`` URI (RFC 7512) for a key held in an HSM or a KMS with a PKCS#11 module: refused
  for now with the way to do it (README, "Signing");
* ``sigstore`` (keyless): refused likewise; see the README.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import ConfigError
from k3artifacts.signing.dsse import CURVE_HASHES, key_hint, sign_statement

SIGNING_KEY_ENV = "K3A_SIGNING_KEY"
PASSWORD_ENV = "K3A_SIGNING_KEY_PASSWORD"
#: P-521 verifies (sigstore allows it) but is not offered for signing: HSMs rarely hold it.
SIGNING_CURVES = ("secp256r1", "secp384r1")


@dataclass(frozen=True)
class KeySigner:
    """Signs statements with an ECDSA private key held in memory."""

    private_key: ec.EllipticCurvePrivateKey
    source: str

    @property
    def key_hint(self) -> str:
        return key_hint(self.private_key.public_key())

    def sign(self, statement: dict[str, Any]) -> bytes:
        return sign_statement(self.private_key, statement)


def load_signer(spec: str) -> KeySigner:
    """The signer ``spec`` names (a PEM path; see the module doc for the other forms)."""
    if spec.startswith("pkcs11:"):
        raise ConfigError(
            f"PKCS#11 signing ({spec.split(';')[0]}...) is not wired into k3a yet",
            hint="sign with a PEM key exported for the release role, or see README 'Signing' "
            "for signing with `model_signing sign pkcs11-key` on the published directory",
        )
    if spec == "sigstore":
        raise ConfigError(
            "sigstore keyless signing needs a Fulcio/Rekor reachable and an identity policy on "
            "every verifier; k3a verifies key signatures only",
            hint="use a PEM key (README 'Signing' explains keyless and why it is not the default)",
        )
    path = Path(spec).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"signing key {path}: {exc.strerror or exc}",
                          hint="pass --signing-key PATH to a PEM private key") from None
    password = os.environ.get(PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(
            data, password.encode() if password is not None else None
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"signing key {path}: not a usable PEM private key ({exc})",
            hint=f"an encrypted key needs {PASSWORD_ENV}; generate one with "
            "`openssl ecparam -name prime256v1 -genkey -noout -out KEY.pem`",
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in SIGNING_CURVES:
        kind = key.curve.name if isinstance(key, ec.EllipticCurvePrivateKey) else type(key).__name__
        raise ConfigError(
            f"signing key {path}: {kind} is not ECDSA P-256 or P-384",
            hint="model-signing verifiers accept ECDSA keys; generate a P-256 or P-384 key",
        )
    return KeySigner(key, str(path))


def load_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"trusted key {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"trusted key {path}: not a PEM public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in CURVE_HASHES:
        raise ConfigError(f"trusted key {path}: not an ECDSA public key on a sigstore curve")
    return key


def public_pem(signer: KeySigner) -> bytes:
    return signer.private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
