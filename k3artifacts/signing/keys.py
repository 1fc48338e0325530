"""Signing keys: where a signature comes from.

``--signing-key`` (or ``K3A_SIGNING_KEY``) names one of:

* a PEM private key file, ECDSA on P-256 or P-384 (``openssl ecparam -name prime256v1
  -genkey -noout -out release.pem``); a passphrase, if any, comes from
  ``K3A_SIGNING_KEY_PASSWORD``;
* a ``pkcs11:`` URI (RFC 7512) for an ECDSA key held in an HSM, or a KMS with a PKCS#11
  module, e.g. ``pkcs11:token=release;object=k3a?module-path=/usr/lib/softhsm/libsofthsm2.so
  &pin-source=file:/run/secrets/pin``: the key never leaves the token; the signing is done by
  model-signing's PKCS#11 signer (the ``pkcs11`` extra) over our statement;
* ``sigstore`` (keyless): refused, with the way to do it (README, "Signing").

Every signer has ``public_key``, ``key_hint`` and ``sign(statement) -> bundle bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3artifacts.errors import ConfigError
from k3artifacts.settings import load
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
    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self.private_key.public_key()

    @property
    def key_hint(self) -> str:
        return key_hint(self.public_key)

    def sign(self, statement: dict[str, Any]) -> bytes:
        return sign_statement(self.private_key, statement)


@dataclass(frozen=True)
class _Payload:
    """What model-signing's signers read from their ``Payload``: an in-toto statement."""

    statement: Any


class Pkcs11Signer:
    """Signs statements with a key held in a PKCS#11 token, through model-signing's signer
    (it hashes the DSSE encoding here and has the token sign the digest)."""

    def __init__(self, uri: str):
        # The URI may carry a PIN (pin-value): never repeat it in messages.
        self.source = uri.split("?", 1)[0]
        try:
            from model_signing._signing.sign_pkcs11 import Signer
        except ImportError as exc:
            raise ConfigError(
                f"PKCS#11 signing needs model-signing's pkcs11 support ({exc})",
                hint="pip install 'k3artifacts[pkcs11]'",
            ) from None
        try:
            self._signer = Signer(uri)
        except Exception as exc:  # PyKCS11 and the URI parser raise their own types
            raise ConfigError(
                f"PKCS#11 key {self.source}: {type(exc).__name__}: {exc}",
                hint="check the token and object names, module-path and the PIN "
                "(pin-source=file:... or pin-value=...)",
            ) from None
        self.public_key: ec.EllipticCurvePublicKey = self._signer.public_key()
        if self.public_key.curve.name not in SIGNING_CURVES:
            raise ConfigError(f"PKCS#11 key {self.source}: {self.public_key.curve.name} is not "
                              "ECDSA P-256 or P-384")

    @property
    def key_hint(self) -> str:
        return key_hint(self.public_key)

    def sign_bytes(self, message: bytes) -> bytes:
        """A DER ECDSA signature over ``message``: hashed here with the curve's digest, the
        digest signed by the token (what records signed by an identity key need: no bundle)."""
        import PyKCS11
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

        digest = hashes.Hash(CURVE_HASHES[self.public_key.curve.name]())
        digest.update(message)
        key_id, label = self._signer.pkcs11_uri.get_keyid_and_label()
        private = self._signer.find_object(PyKCS11.CKO_PRIVATE_KEY, label=label, id=key_id)
        raw = bytes(self._signer.session.sign(private, digest.finalize(),
                                              mecha=PyKCS11.Mechanism(PyKCS11.CKM_ECDSA, None)))
        # The token answers r || s (PKCS#11's form); X.509 verifiers take DER.
        half = len(raw) // 2
        return encode_dss_signature(int.from_bytes(raw[:half]), int.from_bytes(raw[half:]))

    def sign(self, statement: dict[str, Any]) -> bytes:
        from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
        from in_toto_attestation.v1.statement import Statement

        subjects = [ResourceDescriptor(name=s["name"], digest=s["digest"]).pb
                    for s in statement["subject"]]
        payload = _Payload(Statement(subjects, statement["predicateType"],
                                     statement["predicate"]))
        return self._signer.sign(payload).bundle.to_json().encode()


Signer = KeySigner | Pkcs11Signer


def load_signer(spec: str) -> Signer:
    """The signer ``spec`` names (a PEM path or a pkcs11: URI; see the module doc)."""
    if spec.startswith("pkcs11:"):
        return Pkcs11Signer(spec)
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
    secret = load().signing_key_password
    password = secret.get_secret_value() if secret is not None else None
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


def parse_public_key(pem: bytes, where: str) -> ec.EllipticCurvePublicKey:
    """A trusted release key from its PEM text; ``where`` names it in errors."""
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise ConfigError(f"trusted key {where}: not a PEM public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in CURVE_HASHES:
        raise ConfigError(f"trusted key {where}: not an ECDSA public key on a sigstore curve")
    return key


def public_pem(signer: Signer) -> bytes:
    return signer.public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
